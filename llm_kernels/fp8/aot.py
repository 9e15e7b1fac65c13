"""The W8A16 kernel compiled for a GPU it does not run on: Triton's compiler and the ptxas
its wheel ships build the cubin for any NVIDIA target on a machine without a GPU. Tests use it
to check that every tuner candidate compiles for Hopper (sm_90, wgmma) and Ampere (sm_80,
mma.sync), and that the hardware e4m3 conversion is refused below sm_89; a maintainer can
read the compiled loop (`.asm["ptx"]`, `.asm["cubin"]` for nvdisasm) to count its work."""
from __future__ import annotations

import torch

from llm_kernels.fp8 import w8a16

_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
# what Triton's launcher would see at a real call: 16-byte aligned pointers, row strides and sizes
_ALIGNED = ("x_ptr", "w_ptr", "s_ptr", "xs_ptr", "bias_ptr", "out_ptr", "ws_ptr", "cnt_ptr", "N", "K",
            "stride_xm", "stride_wn", "stride_om")


def compile_w8a16(arch: int, dtype, cfg: dict, block=None, split: int = 2, bias: bool = True,
                  forced_cvt: int | None = None):
    """The compiled kernel (triton's CompiledKernel) of one config for sm_<arch>; forced_cvt
    overrides the conversion (to see the hardware one refused below sm_89)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from llm_kernels.pdl import pdl_for

    fn = w8a16.w8a16_kernel.built(False)
    t = _TYPES[dtype]
    a8 = cfg.get("kind") == "w8a8"  # W8A8: e4m3 activations and weight, typed as such (see w8a16.launch)
    sig = {"x_ptr": "*fp8e4nv" if a8 else f"*{t}", "w_ptr": "*fp8e4nv" if a8 else "*u8", "s_ptr": "*fp32", "xs_ptr": "*fp32", "bias_ptr": f"*{t}", "out_ptr": f"*{t}",
           "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
           "stride_wn": "i32", "stride_om": "i32", "stride_sn": "i32", "stride_xs": "i32", "KPS": "i32"}
    const = w8a16.constexprs(cfg, dtype, divmod(arch, 10), block, 1, split, True, bias)
    if forced_cvt is not None:
        const["CVT"] = forced_cvt
    const["PDL"] = pdl_for(arch)
    sig.update({k: "constexpr" for k in const})
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                    attrs={(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in _ALIGNED})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": cfg.get("warps", 4), "num_stages": cfg.get("stages", 3)})
