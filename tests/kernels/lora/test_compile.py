"""The LoRA kernels compile for Hopper (sm_90) on this CPU-only machine: triton's front end
and its CUDA backend (ptxas ships with triton) need no GPU, so a type error in a loop-carried
value, a dot the MMA cannot take or a shared-memory overrun of a candidate config shows here
and not first on the GPU machine. Skipped where this triton lacks the API or the backend. Each
check runs in a fresh process (tests/kernels/fresh_process.py). The pointers, sizes and strides a
launch passes as multiples of 16 are compiled so (as Triton specialises them), and at decode
token counts each kernel has a candidate that spills no register (for the shrink, at a merged
q/k/v's 64 rank columns and at 16). Each reads global memory before its grid-dependency wait
and stores only after it (the late wait of llm_kernels.lora.kernels)."""
import pytest
import torch

from llm_kernels.lora import kernels, onehot
from llm_kernels.lora.configs import ONEHOT, expand_configs, shrink_configs
from tests.kernels.fresh_process import run_fresh
from tests.kernels.kernel_checks import compile_for, spill_bytes, waits_late

H100_SHARED = 227 * 1024


# what a launch passes as multiples of 16 (Triton's specialisation): pointers, K and N, the strides
ALIGNED = ("x_ptr", "a_ptr", "y_ptr", "ws_ptr", "b_ptr", "out_ptr", "K", "N", "stride_xt", "stride_as", "stride_ar",
           "stride_yt", "stride_bs", "stride_bn", "stride_ot")


def compiled(lazy, signature: dict, constexprs: dict, cfg: dict):
    """The kernel compiled for sm_90 with cfg's warps and stages (its helpers built in compiled mode:
    the process runs with TRITON_INTERPRET=0)."""
    pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"this triton has no ahead-of-time compile API: {exc}")
    lazy[(1,)]  # builds the JIT function and its helpers in compiled mode, launches nothing
    try:
        return compile_for(lazy._built[False], signature, constexprs, 90,
                           {"num_warps": cfg.get("warps", 4), "num_stages": cfg.get("stages", 3)},
                           [k for k in ALIGNED if k in signature])
    except (RuntimeError, FileNotFoundError) as exc:
        if "ptxas" in str(exc) or "backend" in str(exc).lower():
            pytest.skip(f"no CUDA backend here: {exc}")
        raise


K = 3584  # Qwen2.5-7B's hidden size: the K of the shrinks of q/k/v, o and gate/up


def shrink_signature(dt):
    ints = ("T", "K", "R", "S", "k_per_split", "stride_xt", "stride_as", "stride_ar")
    return {"x_ptr": f"*{dt}", "a_ptr": f"*{dt}", "slots_ptr": "*i32", "y_ptr": "*fp32", "ws_ptr": "*fp32",
            "cnt_ptr": "*i32", **{k: "i32" for k in ints}}


def expand_signature(dt):
    ints = ("T", "N", "R", "S", "stride_yt", "stride_bs", "stride_bn", "stride_ot", "tiles1", "tiles2", "col1", "col2")
    return {"y_ptr": "*fp32", "b_ptr": f"*{dt}", "slots_ptr": "*i32", "out_ptr": f"*{dt}", **{k: "i32" for k in ints}}


@pytest.mark.parametrize("dtype,T", [("bfloat16", 64), ("bfloat16", 4096), ("float32", 64)])
def test_candidate_configs_compile_for_sm90(dtype, T):
    """Every candidate of a decode and a prefill token count (float32 has one); the shrink with
    its split-K epilogue (the other variant is a subset of its code), once without; the one-dot
    kernels at 16 and 64 columns a slot."""
    run_fresh(__name__, "check_candidates", dtype, T)


def check_candidates(dtype_name: str, T: int) -> None:
    dtype = getattr(torch, dtype_name)
    dt, fp32 = ("bf16", False) if dtype == torch.bfloat16 else ("fp32", True)
    cuda = torch.device("cuda")  # only read for its type: nothing touches CUDA
    spills = {}  # (kernel, rank columns) -> each candidate's stack bytes
    for i, cfg in enumerate(shrink_configs(T, dtype, cuda)):
        if cfg.get("kind") == ONEHOT:  # 8 slots of rank 16, and of a merged q/k/v's 3 x 16 (64 columns)
            for br in (16, 64):
                k = compiled(onehot._shrink_onehot_kernel, shrink_signature(dt),
                             {"BLOCK_M": cfg["BM"], "BLOCK_K": cfg["BK"], "BLOCK_R": br,
                              "SLOTS_C": onehot.slots_per_chunk(cfg, 8, br), "SPLIT_P2": kernels.split_p2(K, br, cfg),
                              "FP32": fp32}, cfg)
                assert k.metadata.shared <= H100_SHARED, (cfg, br, k.metadata.shared)
                assert waits_late(k.asm["ptx"]), (cfg, br)
                spills.setdefault(("shrink", br), []).append(spill_bytes(k))
            continue
        # the SPLIT_P2 a launch on the layer passes (split_p2), and once (the first) without a split
        variants = [(kernels.split_p2(K, 16, cfg), 16), (kernels.split_p2(K, 64, cfg), 64), (1, 16)]
        for split, br in variants[: 3 if i == 0 else 2]:
            k = compiled(kernels._shrink_kernel, shrink_signature(dt),
                         {"BLOCK_M": cfg["BM"], "BLOCK_K": cfg["BK"], "BLOCK_R": br, "SPLIT_P2": split, "FP32": fp32},
                         cfg)
            assert k.metadata.shared <= H100_SHARED, (cfg, k.metadata.shared)
            assert waits_late(k.asm["ptx"]), (cfg, split, br)
            if split > 1:
                spills.setdefault(("shrink", br), []).append(spill_bytes(k))
    for cfg in expand_configs(T, dtype, cuda):
        for br in (16, 64):  # rank 16, and 64 (a larger max_lora_rank)
            if cfg.get("kind") == ONEHOT:
                k = compiled(onehot._expand_onehot_kernel, expand_signature(dt),
                             {"BLOCK_M": cfg["BM"], "BLOCK_N": cfg["BN"], "BLOCK_R": br,
                              "SLOTS_C": onehot.slots_per_chunk(cfg, 8, br), "FP32": fp32}, cfg)
            else:
                k = compiled(kernels._expand_kernel, expand_signature(dt),
                             {"BLOCK_M": cfg["BM"], "BLOCK_N": cfg["BN"], "BLOCK_R": br, "FP32": fp32}, cfg)
            assert k.metadata.shared <= H100_SHARED, (cfg, br, k.metadata.shared)
            assert waits_late(k.asm["ptx"]), (cfg, br)
            spills.setdefault(("expand", br), []).append(spill_bytes(k))
            if not fp32:
                assert "mma" in k.asm["ptx"]  # the expand's dot on tensor cores
    if T <= 256 and not fp32:  # decode in a half dtype (float32 is the correctness path)
        for what, stacks in spills.items():
            assert min(stacks) == 0, f"every {what} candidate at T={T} spills registers: {stacks}"
