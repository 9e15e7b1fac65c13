"""The kpack kernel's stream-K grid (llm_kernels.w4a16.kpack): how many programs a launch
runs (those resident per SM, from the compiled kernel's registers and shared memory, times
the SMs) and how many of them can share one output tile (the workspace slots a tile needs)."""
import torch

from llm_kernels.dispatch import config_key, sm_count

PLANS: dict = {}
RESIDENT: dict = {}  # resident_key -> programs resident per SM, from the compiled kernel


def split_plan(tiles: int, nblk: int, P: int) -> int:
    """C: the most programs that share one tile when U = tiles * nblk units are cut into P runs."""
    key = (tiles, nblk, P)
    c = PLANS.get(key)
    if c is None:
        U = tiles * nblk
        t = torch.arange(tiles, dtype=torch.int64)
        first = ((t * nblk + 1) * P - 1) // U
        last = ((t + 1) * nblk * P - 1) // U
        c = PLANS[key] = int((last - first + 1).max())
    return c


def programs_per_sm(n_regs: int, shared: int, warps: int, regs_sm: int = 65536, smem_sm: int = 233472) -> int:
    """Programs of a compiled kernel that fit on one SM at once. Registers go to warps in
    units of 256, and each warp lives in one of the SM's four scheduler quarters, which
    split the register file: a program of 2 warps at 200 registers fits 4 times, not 5."""
    per_warp = -(-n_regs * 32 // 256) * 256
    by_regs = 4 * ((regs_sm // 4) // max(per_warp, 1)) // warps
    by_smem = smem_sm // (shared + 1024)  # 1 KB the driver reserves per block
    return max(1, min(by_regs, by_smem, 32, 64 // warps))


def resident(kernel, warps: int, device) -> int:
    props = torch.cuda.get_device_properties(device)
    return programs_per_sm(kernel.n_regs, kernel.metadata.shared, warps,
                           getattr(props, "regs_per_multiprocessor", 65536),
                           getattr(props, "shared_memory_per_multiprocessor", 233472))


def resident_key(cfg, x, N, nblk, operands=()) -> tuple:
    """What selects one compiled kernel: the config, the dtype, the device, the constexprs
    (K's block count, the row-tile count, which optional operands it takes: a bias costs
    registers) and Triton's specialisations of M and N."""
    M = x.shape[0]
    return (config_key(cfg), x.dtype, x.device, nblk, -(-M // cfg["BM"]), M == 1, M % 16 == 0, N % 16 == 0,
            tuple(operands))


def program_count(cfg, tiles, nblk, x, N, operands=()) -> int:
    """The programs of a launch: its grid, "tiles", or (auto) those resident per SM times the SMs."""
    grid = cfg.get("grid", "auto")
    if grid == "tiles":
        return tiles
    if isinstance(grid, int):
        return max(1, min(grid, tiles * nblk))
    per_sm = RESIDENT.get(resident_key(cfg, x, N, nblk, operands), 2)  # before the first compile: 2 per SM
    return max(1, min(per_sm * sm_count(x.device), tiles * nblk))


def remember(kernel, cfg, x, N, nblk, operands=()) -> None:
    """After a launch on "auto": the compiled kernel's programs resident per SM, for the next
    launch of the same kernel to size its grid."""
    if x.is_cuda and cfg.get("grid", "auto") == "auto":
        key = resident_key(cfg, x, N, nblk, operands)
        if key not in RESIDENT and hasattr(kernel, "n_regs"):
            RESIDENT[key] = resident(kernel, cfg.get("warps", 4), x.device)
