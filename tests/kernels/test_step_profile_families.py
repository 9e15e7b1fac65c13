"""benchmarks/tools/step_profile.py files each kernel of a traced step under a family: every
Triton kernel of llm_kernels has one (a kernel under "other" hides its time in the profile)."""
import importlib
import pkgutil
from types import SimpleNamespace

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


def _Event(name, start, end):
    """A torch.profiler event as summary() reads it: a name and a time range."""
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end))


def test_a_kernel_that_waits_on_the_one_before_is_charged_its_own_time():
    """Under programmatic dependent launch a kernel starts before the previous one ends and
    waits; its recorded span holds the wait. The summary charges each kernel its time past the
    latest end before it, so the per-kernel times add up to the busy time, not past it."""
    from benchmarks.tools.step_profile import summary

    events = [_Event("rms_norm_kernel", 0.0, 10.0),  # then a GEMM launched early, waiting from 4 to 10
              _Event("_kpack_kernel", 4.0, 30.0),
              _Event("_silu_mul_kernel", 28.0, 29.0),  # inside the GEMM's span: no time of its own
              _Event("_kpack_kernel", 35.0, 45.0)]  # after 5 idle
    s = summary(events, steps=1)
    times = {t["name"]: t["us_per_step"] for t in s["top"]}
    assert times == {"rms_norm_kernel": 10.0, "_kpack_kernel": 30.0, "_silu_mul_kernel": 0.0}
    assert s["busy_us_per_step"] == 40.0 and s["idle_us_per_step"] == 5.0
    assert sum(s["by_family_us"].values()) == s["busy_us_per_step"]
    assert s["by_family_us"]["W4A16 GEMM"] == 30.0
    half = summary(events, steps=2)
    assert half["busy_us_per_step"] == 20.0 and half["by_family_us"]["W4A16 GEMM"] == 15.0
