"""benchmarks/tools/step_profile.py files each kernel of a traced step under a family: every
Triton kernel of llm_kernels has one (a kernel under "other" hides its time in the profile)."""
import importlib
import pkgutil

import llm_kernels
from benchmarks.tools.step_profile import kernel_family
from llm_kernels.dispatch import LazyKernel


def our_kernels() -> dict[str, str]:
    """name -> module of every @lazy_jit kernel defined in llm_kernels."""
    found = {}
    for info in pkgutil.walk_packages(llm_kernels.__path__, "llm_kernels."):
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            if isinstance(obj, LazyKernel) and obj.fn.__module__ == mod.__name__:
                found[obj.fn.__name__] = mod.__name__
    return found


def test_every_kernel_of_ours_has_a_family():
    kernels = our_kernels()
    assert len(kernels) >= 20
    orphans = {name: mod for name, mod in kernels.items() if kernel_family(name) == "other"}
    assert not orphans, f"kernels the step profile files under 'other': {orphans}"


def test_families_of_kernels_with_misleading_names():
    """The FP8 weight-only GEMM and the fp8 dequant are FP8 GEMM (not the 4-bit ones'
    dequant), the MoE router and align are MoE, the gated activation is SiLU-mul."""
    kernels = our_kernels()
    expect = {"w8a16_kernel": "FP8 GEMM", "_dequant_kernel": "FP8 GEMM", "_awq_dequant_kernel": "W4A16 GEMM",
              "_kpack_dequant_kernel": "W4A16 GEMM", "_route_kernel": "MoE", "_align_kernel": "MoE",
              "_act_and_mul_kernel": "SiLU-mul", "_shrink_onehot_kernel": "LoRA"}
    for name, family in expect.items():
        assert name in kernels, name
        assert kernel_family(name) == family, (name, kernel_family(name))
