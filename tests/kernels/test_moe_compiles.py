"""The kpack MoE kernel (llm_kernels.moe_gemm_kpack) compiles for Hopper (sm_90) and Ampere
(sm_80) on this machine without a GPU (Triton's compiler and its ptxas), with the helpers it
borrows from llm_kernels.w4a16.kpack and llm_kernels.moe_gemm built in compiled mode: every
candidate's half-words reach the tensor cores' operand (wgmma on Hopper when swapped) from
shared memory as loaded, pipelined by cp.async (no dequantized tile stored back to shared
memory inside the loop, which the widening kernel does); the router kernel
(llm_kernels.moe_route) compiles for top-1 to top-8 over 8 to 128 experts, and the sort of
moe_align for 16 to 4,096 pairs. Each check runs in a fresh process
(tests/kernels/fresh_process.py)."""
import pytest
import torch

from tests.kernels.fresh_process import run_fresh
from tests.kernels.kernel_checks import compile_for


@pytest.mark.parametrize("arch", [90, 80])
@pytest.mark.parametrize("gated", [True, False])
def test_the_kpack_kernel_compiles_without_a_shared_memory_round_trip(arch, gated):
    run_fresh(__name__, "check_compile", arch, gated)


def check_compile(arch: int, gated: bool) -> None:
    from llm_kernels import moe_gemm_kpack
    from llm_kernels.moe import moe_configs
    from llm_kernels.w4a16.kpack import dequant_asm

    fn = moe_gemm_kpack._moe_kpack_kernel.built(False)
    names = fn.arg_names
    sig = {n: "i32" for n in names}
    sig.update({"a_ptr": "*bf16", "qk_ptr": "*i16", "z_ptr": "*i16", "s_ptr": "*bf16", "out_ptr": "*bf16",
                "ids_ptr": "*i32", "blk_e_ptr": "*i32", "total_ptr": "*i32", "topw_ptr": "*fp32"})
    aligned = ("a_ptr", "qk_ptr", "z_ptr", "s_ptr", "out_ptr", "N", "stride_am", "stride_om", "stride_qe",
               "stride_ze", "stride_se")
    asm = [dequant_asm(j, torch.bfloat16) for j in range(4)]
    for bm in (16, 64):  # a GPU's candidates at decode and prefill blocks, Qwen3-30B-A3B's K (2,048 / 768)
        for cfg in moe_configs(bm, torch.bfloat16, torch.device("cuda"), 128, "kpack"):
            const = dict(NBLK=16 if gated else 6, S=64, G=128, PPG=8, NBASE=0xC300, A_DIV=8 if gated else 1,
                         GATED=gated, MUL_W=not gated, BLOCK_M=bm, BLOCK_N=cfg["BN"], A0=asm[0], A1=asm[1],
                         A2=asm[2], A3=asm[3], EXACT=False, SWAP=cfg["swap"], GROUP_M=8)
            k = compile_for(fn, sig, const, arch, {"num_warps": cfg["warps"], "num_stages": cfg["stages"]}, aligned)
            ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
            start = ttgir.index("scf.for")
            loop = ttgir[start: ttgir.index("scf.yield", start)]
            # Hopper's wgmma takes the dequantized weights from registers as its first operand (swapped)
            # and needs whole warpgroups of 4 warps; otherwise mma.sync
            mma = "wgmma" if arch == 90 and cfg["swap"] and cfg["warps"] % 4 == 0 else "mma.sync"
            assert mma in ptx and "cp.async" in ptx and "lop3.b32" in ptx, (arch, cfg)
            assert "local_alloc" not in loop, f"a tile stored to shared memory in the loop ({arch}, {cfg})"
            assert k.metadata.shared <= 227 * 1024  # within Hopper's shared memory


@pytest.mark.parametrize("arch", [90, 80])
@pytest.mark.parametrize("experts,top_k", [(128, 8), (60, 4), (8, 1)])
def test_the_router_kernel_compiles(arch, experts, top_k):
    run_fresh(__name__, "check_router_compile", arch, experts, top_k)


def check_router_compile(arch: int, experts: int, top_k: int) -> None:
    from llm_kernels import moe_route
    from llm_kernels.dispatch import next_pow2

    fn = moe_route._route_kernel.built(False)
    names = fn.arg_names
    sig = {n: "i32" for n in names}
    sig.update({"logits_ptr": "*bf16", "w_ptr": "*fp32", "ids_ptr": "*i64"})
    const = dict(K=top_k, K_P2=next_pow2(top_k), E_P2=next_pow2(experts), BLOCK_T=moe_route.BLOCK_T, RENORM=True)
    k = compile_for(fn, sig, const, arch, {"num_warps": 4})
    assert "ld.global" in k.asm["ptx"] and k.metadata.shared <= 48 * 1024


@pytest.mark.parametrize("pairs,warps", [(16, 4), (512, 4), (4096, 8)])
def test_the_sort_kernel_compiles(pairs, warps):
    run_fresh(__name__, "check_align_compile", pairs, warps)


def check_align_compile(pairs: int, warps: int) -> None:
    from llm_kernels import moe

    fn = moe._align_kernel.built(False)
    names = fn.arg_names
    sig = {n: "i32" for n in names}
    sig.update({"ids_ptr": "*i64", "sorted_ptr": "*i32", "blk_e_ptr": "*i32", "total_ptr": "*i32", "off_ptr": "*i32"})
    const = dict(E_BINS=256, PAIRS=pairs, CHUNK=moe._CHUNK)
    k = compile_for(fn, sig, const, 90, {"num_warps": warps})
    assert "st.global" in k.asm["ptx"] and k.metadata.shared <= 227 * 1024
