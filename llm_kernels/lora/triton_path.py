"""add_lora on the Triton kernels (CUDA; CPU tensors under the interpreter): the configs
tuned per shape, the split-K arrival counters kept per device, the strides the kernels need.

Tuning runs on inputs of its own: synthetic slots (decode-sized batches round-robin over up to
TUNE_SLOTS adapters, the mix that costs most; larger ones in runs of 64 tokens, as prefill
sequences come), inputs for the expand and scratch outputs, so what the first call's slots
hold (an engine's warm-up may have none) does not decide the configs, and the caller's out is
never touched twice."""
from __future__ import annotations

import torch

from llm_kernels.dispatch import autotune, interpret_mode, sm_count
from llm_kernels.lora.configs import ONEHOT, expand_configs, expand_key, shrink_configs, shrink_key
from llm_kernels.lora.kernels import block_r, launch_expand, launch_shrink, shrink_units
from llm_kernels.lora.onehot import launch_expand_onehot, launch_shrink_onehot

TUNE_SLOTS = 8
_COUNTERS: dict = {}  # device -> int32 zeros, the shrink's arrival counters (zero between launches)


def counters(device, n: int) -> torch.Tensor:
    """At least n zero int32 counters of the device, kept across calls (each launch leaves its
    own at zero); made fresh (a memset in the graph) when first needed inside a capture."""
    have = _COUNTERS.get(device)
    if have is not None and have.numel() >= n:
        return have
    fresh = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _COUNTERS[device] = fresh
    return fresh


def tuning_slots(T: int, S: int, device) -> torch.Tensor:
    """The slots configs are timed on: round-robin over min(S, TUNE_SLOTS) for T <= 256, runs of
    64 tokens above."""
    used = max(1, min(S, TUNE_SLOTS))
    t = torch.arange(T, device=device, dtype=torch.int32)
    return (t % used if T <= 256 else (t // 64) % used).to(torch.int32)


def _fp32(dtype) -> bool:
    """float32 dots (ieee): for float32 models, and for every dtype in the interpreter."""
    return dtype == torch.float32 or interpret_mode()


def shrink(x, a, slots, config: dict | None = None) -> torch.Tensor:
    """y float32 [T, block_r(R)] = x a[slot]^T per token (the config tuned for the shape unless given)."""
    T, K = x.shape
    sms = sm_count(x.device)
    fp32 = _fp32(x.dtype)

    def run(cfg, s=slots):
        return _shrink_launcher(cfg)(x, a, s, cfg, sms, counters(x.device, shrink_units(cfg, a.shape[0], T)), fp32)

    if config is None:
        synthetic = {}

        def timed(cfg):
            if not synthetic:  # made at the first timed call, outside any capture
                synthetic["slots"] = tuning_slots(T, a.shape[0], x.device)
            return run(cfg, synthetic["slots"])

        config = autotune("lora_shrink", shrink_key(T, K, block_r(a.shape[1]), x.dtype),
                          lambda: shrink_configs(T, x.dtype, x.device), timed, checked=(x.dtype,),
                          cold_l2_device=x.device if x.is_cuda else None)
    return run(config)


def expand(y, b, slots, out, slices, config: dict | None = None) -> None:
    """out += y b[slot]^T on the rows with an adapter, slice i of out's columns on y's columns
    i R ... (i + 1) R (the config tuned for the shape unless given)."""
    T, N = out.shape
    fp32 = _fp32(out.dtype)
    if config is None:
        scratch = {}

        def timed(cfg):
            if not scratch:  # made at the first timed call, outside any capture
                scratch["slots"] = tuning_slots(T, b.shape[0], out.device)
                scratch["out"] = torch.empty_like(out)
                # y of its own: the call's y has no rows for tokens without an adapter
                scratch["y"] = torch.linspace(-1, 1, y.numel(), device=y.device).view(y.shape)
            scratch["out"].zero_()
            return _expand_launcher(cfg)(scratch["y"], b, scratch["slots"], scratch["out"], cfg, fp32, slices)

        config = autotune("lora_expand", expand_key(T, N, block_r(b.shape[2]), len(slices), out.dtype),
                          lambda: expand_configs(T, out.dtype, out.device), timed, checked=(out.dtype,),
                          cold_l2_device=out.device if out.is_cuda else None)
    _expand_launcher(config)(y, b, slots, out, config, fp32, slices)


def _shrink_launcher(cfg: dict):
    """The shrink kernel a config is for: the one-dot kernel (kind ONEHOT) or the walking one."""
    return launch_shrink_onehot if cfg.get("kind") == ONEHOT else launch_shrink


def _expand_launcher(cfg: dict):
    """The expand kernel a config is for."""
    return launch_expand_onehot if cfg.get("kind") == ONEHOT else launch_expand


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def add_lora_triton(out, x, a, b, slots, shrink_config: dict | None = None,
                    expand_config: dict | None = None, output_slices=None) -> None:
    """add_lora on the kernels: shrink, then expand into out. Configs (tests, benchmarks)
    replace the tuned ones."""
    if out.shape[0] == 0 or a.shape[0] == 0:
        return
    x, a, b, slots = _unit_last(x), _unit_last(a), _unit_last(b), slots.contiguous()
    slices = tuple(output_slices or (out.shape[1],))
    y = shrink(x, a, slots, shrink_config)
    if out.stride(-1) == 1:
        expand(y, b, slots, out, slices, expand_config)
        return
    dense = out.contiguous()  # a view with strided columns: the kernel writes rows of unit stride
    expand(y, b, slots, dense, slices, expand_config)
    out.copy_(dense)
