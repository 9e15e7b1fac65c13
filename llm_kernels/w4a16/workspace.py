"""The split-K workspace of the W4A16 kernels: float32 partials and per-tile arrival
counters, one pair per device, shared by llm_kernels.w4a16.ckpt and llm_kernels.w4a16.kpack."""
import torch

WS_FLOATS = 8 << 20  # 32 MB of float32 partials per device, allocated once, never freed
WS_TILES = 1 << 16  # arrival counters (zero between launches)
_WS: dict = {}


def workspace(device):
    """(partials, counters) of the device; None when first asked inside a graph
    capture (an allocation there would belong to the graph)."""
    ws = _WS.get(device)
    if ws is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        ws = _WS[device] = (torch.empty(WS_FLOATS, dtype=torch.float32, device=device),
                            torch.zeros(WS_TILES, dtype=torch.int32, device=device))
    return ws
