"""Shared checks for the kernel tests: relative error against the reference; a kernel compiled
for a GPU this machine does not have, and its register spills."""
import os
import re
import subprocess
import tempfile

import torch

# float32 kernels land far under 1e-4; half types round at ~1e-3
TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_close(out, ref, dtype, seed, what=""):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), f"{what}: NaN in output (unwritten element?) seed={seed}"
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"{what}: rel err {err:.3g} >= {TOL[dtype]} (seed={seed})"


def spill_bytes(k) -> int:
    """The stack bytes a compiled kernel's threads use (0: no register spills)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return int(usage.split("STACK:")[1].split()[0])


def partials_in_vectors(ptx: str) -> bool:
    """A split-K kernel's float32 partials are read back (its only .cg loads) 16 bytes at a time.
    Under a mask of the rows below M, a swapped tile's contiguous rows fell to single floats, and
    that reduction made M = 50 1.3-3x slower than M = 48 or 64 on an H100."""
    loads = re.findall(r"ld\.global\.cg[.\w:]*", ptx)
    return bool(loads) and all(".v4." in op for op in loads)


def waits_before_loading(ptx: str) -> bool:
    """Programmatic dependent launch (llm_kernels.pdl): the kernel's grid-dependency wait comes
    before its first read of global memory (a load, a copy to shared memory or an atomic), so
    nothing an earlier kernel writes is read before that kernel is done."""
    wait = ptx.find("griddepcontrol.wait")
    first = min((i for i in (ptx.find(op) for op in ("ld.global", "cp.async", "atom.global", "red.global"))
                 if i >= 0), default=len(ptx))
    return 0 <= wait < first


def waits_late(ptx: str) -> bool:
    """The LoRA kernels' late wait (llm_kernels.lora.kernels): a global read before the first
    grid-dependency wait, no store, atomic or reduction before it, and the next kernel released
    only after it."""
    wait = ptx.find("griddepcontrol.wait")
    first = min((i for i in (ptx.find(op) for op in ("ld.global", "cp.async")) if i >= 0), default=len(ptx))
    writes = [i for i in (ptx.find(op) for op in ("st.global", "atom.global", "red.global")) if i >= 0]
    return 0 <= first < wait and all(w > wait for w in writes) \
        and ptx.find("griddepcontrol.launch_dependents") > wait


def compile_for(fn, sig: dict, const: dict, arch: int, options: dict, aligned=()):
    """fn compiled for sm_<arch>: sig's types, const's compile-time values, aligned's 16-divisible."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from llm_kernels.pdl import pdl_for

    names = fn.arg_names
    if "PDL" in names and "PDL" not in const:  # as the launch on that GPU would (llm_kernels.pdl)
        const = {**const, "PDL": pdl_for(arch)}
    src = ASTSource(fn, {**sig, **{k: "constexpr" for k in const}},
                    constexprs={(names.index(k),): v for k, v in const.items()},
                    attrs={(names.index(k),): [["tt.divisibility", 16]] for k in aligned})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
