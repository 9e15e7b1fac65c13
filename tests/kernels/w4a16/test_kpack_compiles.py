"""The dense K-packed W4A16 kernel (llm_kernels.w4a16.kpack) compiles for Hopper (sm_90) and
Ampere (sm_80) on this machine without a GPU (Triton's compiler and its ptxas): every GPU
candidate at decode and prefill token counts, on Qwen2.5-7B's qkv (K 3,584) with its bias and
without. The half-words reach the tensor cores (wgmma on Hopper when swapped on whole
warpgroups) through the LOP3 dequant, pipelined by cp.async; the bias (added once, at a tile's
store) adds no copy, no tensor-core instruction and no shared memory, and the kernel stays
within Hopper's shared memory. At every token count some candidate runs without spilling
registers to local memory on Hopper (the cubin's resource usage, read by the cuobjdump that
ships with Triton), every candidate reads its split tiles' partials back in 16-byte vectors, and
on Hopper waits for the previous kernel (programmatic dependent launch) before reading anything. Each check runs in a fresh process (tests/kernels/fresh_process.py)."""
import pytest
import torch

from tests.kernels.fresh_process import run_fresh
from tests.kernels.kernel_checks import compile_for, partials_in_vectors, spill_bytes, waits_before_loading


@pytest.mark.parametrize("arch", [90, 80])
@pytest.mark.parametrize("M", [16, 64, 256])
def test_every_candidate_compiles_and_the_bias_costs_the_loop_nothing(arch, M):
    run_fresh(__name__, "check_compile", arch, M)


def _hot(k, mma: str) -> tuple:
    """What the K loop is made of: copies issued, tensor-core instructions, shared memory."""
    ptx = k.asm["ptx"]
    return ptx.count("cp.async.cg.shared.global"), ptx.count(mma), k.metadata.shared


def check_compile(arch: int, M: int) -> None:
    pytest.importorskip("triton")
    from llm_kernels.w4a16 import configs, kpack

    configs.sm_count = lambda device: 132  # an H100's SMs: no GPU here to ask (this process only)

    fn = kpack._kpack_kernel.built(False)
    sig = {n: "i32" for n in fn.arg_names}
    sig.update({"x_ptr": "*bf16", "qk_ptr": "*i16", "z_ptr": "*i16", "s_ptr": "*bf16", "out_ptr": "*bf16",
                "b_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32"})
    aligned = ("x_ptr", "qk_ptr", "z_ptr", "s_ptr", "out_ptr", "b_ptr", "ws_ptr", "cnt_ptr", "N", "stride_xm",
               "stride_om")
    asm = [kpack.dequant_asm(j, torch.bfloat16) for j in range(4)]
    spills = {}
    for cfg in configs.kpack_configs(M, torch.bfloat16, torch.device("cuda")):
        hot = {}
        for bias in (False, True):
            const = dict(G=128, NBLK=28, MT=-(-M // cfg["BM"]), BLOCK_M=cfg["BM"], BLOCK_N=cfg["BN"], PPG=8,
                         NBASE=0xC300, A0=asm[0], A1=asm[1], A2=asm[2], A3=asm[3], EXACT=False,
                         SWAP=bool(cfg.get("swap")), S=kpack.STRIPE, HAS_BIAS=bias)
            options = {"num_warps": cfg.get("warps", 4), "num_stages": cfg.get("stages", 3)}
            k = compile_for(fn, sig, const, arch, options, aligned)
            ptx = k.asm["ptx"]
            mma = "wgmma" if arch == 90 and cfg.get("swap") and cfg.get("warps", 4) % 4 == 0 else "mma.sync"
            assert mma in ptx and "cp.async" in ptx and "lop3.b32" in ptx, (arch, M, cfg, bias)
            assert k.metadata.shared <= 227 * 1024, (arch, M, cfg, k.metadata.shared)
            assert partials_in_vectors(ptx), (arch, M, cfg, bias)
            # Hopper launches it with programmatic dependent launch: it waits before any read;
            # Ampere has no such launch, and the kernel no such instruction
            assert waits_before_loading(ptx) if arch == 90 else "griddepcontrol" not in ptx, (arch, M, cfg)
            hot[bias] = _hot(k, mma)
            if not bias:
                spills[str(cfg)] = spill_bytes(k)
        assert hot[True] == hot[False], f"the bias changed the K loop ({arch}, M={M}, {cfg}): {hot}"
    if arch == 90:
        assert min(spills.values()) == 0, f"every candidate at M={M} spills registers: {spills}"
