"""The tuner's candidate configs of the LoRA kernels (llm_kernels.lora.kernels) and the keys
they are tuned under. The first candidate is the interpreter's, the one taken inside a graph
capture before the shape was tuned, and the yardstick the others must agree with; the lists
stay short (each candidate is timed once per key on CUDA).

shrink {BM, BK, waves | split, slots, warps, stages}: token tile, K step, K split (about
`waves` programs an SM, or `split` parts), programs a tile gets along its distinct slots
(llm_kernels.lora.kernels.slot_groups; "all" when absent). expand {BM, BN, slots, warps,
stages}: token tile, N tile, slot programs. Decode takes a program per slot of a tile (its
adapters' loads in parallel), prefill one or two (a tile of one sequence has one slot).
Configs of kind "onehot" run llm_kernels.lora.onehot (every slot of a tile in one dot;
`cols`: the stacked operand's columns a dot) and are candidates at decode token counts only."""
import torch

from llm_kernels.dispatch import next_pow2

ONEHOT = "onehot"  # the kind of llm_kernels.lora.onehot's configs
TOKEN_BUCKET_CAP = 1024  # token counts above share one key: tiles of one sequence's tokens alike


def token_bucket(T: int) -> int:
    """What a config is tuned for along the tokens: T up to its next power of two, capped."""
    return min(next_pow2(max(1, T)), TOKEN_BUCKET_CAP)


def shrink_key(T: int, K: int, br: int, dtype) -> tuple:
    return (token_bucket(T), K, br, dtype)


def expand_key(T: int, N: int, br: int, slices: int, dtype) -> tuple:
    return (token_bucket(T), N, br, slices, dtype)


def _bm(T: int, cap: int) -> int:
    """A token tile holding all of a decode batch up to cap rows, at least 16 (the MMA side)."""
    return max(16, min(cap, next_pow2(max(1, T))))


def _unique(configs: list[dict]) -> list[dict]:
    """The configs in order, each once (a small T makes some tiles alike)."""
    out = []
    for cfg in configs:
        if cfg not in out:
            out.append(cfg)
    return out


def shrink_configs(T: int, dtype, device) -> list[dict]:
    """Candidates of the shrink for T tokens."""
    if device.type != "cuda":  # the interpreter: small tiles, K split 3 ways (the workspace path)
        return [{"BM": 16, "BK": 32, "split": 3}, {"BM": 32, "BK": 16, "split": 1, "slots": 1},
                {"BM": 16, "BK": 32, "split": 2, "slots": 2}, {"kind": ONEHOT, "BM": 16, "BK": 32, "split": 2, "cols": 32}]
    if dtype == torch.float32:
        return [{"BM": 16, "BK": 32, "waves": 2, "warps": 4, "stages": 2}]
    bm = _bm(T, 64)
    if T <= 256:
        # decode: few token tiles, K split until the programs fill the SMs or in 4 (long K
        # ranges: fewer partials to sum, at 50 tokens over 8 adapters on an H100 the fastest
        # for qkv, 8.4 against 10.4 us, and gate_up). A tile of 16 rows takes up to 32 splits
        # (the partials its last program sums at once), one of 64 up to 8; smaller tiles read
        # an adapter's A once per tile (from L2 after the first)
        return _unique([{"BM": 16, "BK": 64, "waves": 2, "warps": 4, "stages": 3},
                        {"BM": 16, "BK": 128, "waves": 2, "warps": 4, "stages": 3},
                        {"BM": 16, "BK": 128, "split": 4, "warps": 4, "stages": 3},
                        {"BM": 16, "BK": 256, "split": 4, "warps": 4, "stages": 3},
                        # the 128-deep split on 8 warps: on 4, a merged q/k/v's 64 rank columns
                        # spill registers at sm_90 (255 and 144 bytes of stack), on 8 they do not
                        {"BM": 16, "BK": 128, "split": 4, "warps": 8, "stages": 3},
                        {"BM": bm, "BK": 64, "waves": 2, "warps": 4, "stages": 3},
                        {"BM": bm, "BK": 128, "waves": 1, "warps": 4, "stages": 3},
                        {"BM": bm, "BK": 128, "waves": 2, "slots": 1, "warps": 4, "stages": 3},
                        {"BM": bm, "BK": 64, "waves": 4, "slots": 2, "warps": 4, "stages": 3},
                        # the one-dot kernel, 128 columns (slots) a program: it won down (K 18,944)
                        # on an H100 (9.9 us; 11.2 with 64-deep K steps)
                        {"kind": ONEHOT, "BM": 16, "BK": 128, "cols": 128, "waves": 2, "warps": 8, "stages": 3}])
    # prefill: the token tiles alone fill the machine, few or no splits
    return [{"BM": 64, "BK": 64, "waves": 2, "slots": 1, "warps": 4, "stages": 3},
            {"BM": 128, "BK": 64, "waves": 1, "slots": 1, "warps": 8, "stages": 3},
            {"BM": 64, "BK": 128, "waves": 1, "slots": 2, "warps": 4, "stages": 3}]


def expand_configs(T: int, dtype, device) -> list[dict]:
    """Candidates of the expand for T tokens."""
    if device.type != "cuda":  # the interpreter
        return [{"BM": 16, "BN": 32}, {"BM": 32, "BN": 64, "slots": 1}, {"BM": 16, "BN": 32, "slots": 2},
                {"kind": ONEHOT, "BM": 16, "BN": 32, "cols": 32}]
    if dtype == torch.float32:
        return [{"BM": 16, "BN": 64, "warps": 4, "stages": 2}]
    bm = _bm(T, 64)
    if T <= 256:
        # each token tile reads every adapter it holds: fewer, taller tiles read B fewer times
        return _unique([{"BM": bm, "BN": 128, "warps": 4, "stages": 2},
                        {"BM": bm, "BN": 64, "warps": 4, "stages": 2},
                        {"BM": bm, "BN": 256, "warps": 8, "stages": 2},
                        {"BM": _bm(T, 128), "BN": 128, "warps": 8, "stages": 2},
                        {"BM": bm, "BN": 128, "slots": 1, "warps": 4, "stages": 2},
                        {"BM": bm, "BN": 64, "slots": 1, "warps": 4, "stages": 2},
                        {"BM": bm, "BN": 128, "slots": 2, "warps": 4, "stages": 2},
                        {"BM": bm, "BN": 256, "slots": 1, "warps": 8, "stages": 2},
                        # the one-dot kernel: on an H100 at 64 tokens over 8 adapters these two won
                        # every projection (gate_up the first, the others the second)
                        {"kind": ONEHOT, "BM": bm, "BN": 64, "cols": 128, "warps": 4, "stages": 2},
                        {"kind": ONEHOT, "BM": bm, "BN": 32, "cols": 512, "warps": 8, "stages": 1},
                        # the first of those on 8 warps: on 4 it spills at 64 tokens on sm_90 (255
                        # registers, 72 bytes of stack), on 8 it does not (179)
                        {"kind": ONEHOT, "BM": bm, "BN": 64, "cols": 128, "warps": 8, "stages": 2}])
    return [{"BM": 64, "BN": 128, "slots": 1, "warps": 4, "stages": 2},
            {"BM": 128, "BN": 128, "slots": 1, "warps": 8, "stages": 2},
            {"BM": 64, "BN": 256, "slots": 2, "warps": 8, "stages": 2}]
