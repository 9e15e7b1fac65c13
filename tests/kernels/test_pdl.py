"""Programmatic dependent launch (llm_kernels.pdl): every kernel built with @lazy_jit(pdl=True)
declares `PDL: tl.constexpr = False` and, before anything else, waits for the previous kernel
(gdc_wait) and lets the next one start (gdc_launch_dependents), so no program of it reads
another kernel's output early or exits before the kernel it depends on is done; the launch adds
PDL and launch_pdl only where pdl_on says so (never in the interpreter or without a GPU)."""
import ast
import importlib
import inspect
import pkgutil
import textwrap

import pytest

import llm_kernels
from llm_kernels import dispatch, pdl
from llm_kernels.dispatch import LazyKernel


def _kernels():
    found = []
    for info in pkgutil.walk_packages(llm_kernels.__path__, "llm_kernels."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if isinstance(obj, LazyKernel) and obj.fn.__module__ == module.__name__:
                found.append((f"{module.__name__}.{name}", obj))
    return found


KERNELS = _kernels()


def test_the_decode_paths_kernels_take_part():
    names = {n for n, k in KERNELS if k.pdl}
    for want in ("llm_kernels.norm._rms_norm_kernel", "llm_kernels.w4a16.kpack._kpack_kernel",
                 "llm_kernels.attention._decode_kernel", "llm_kernels.lora.kernels._shrink_kernel",
                 "llm_kernels.fp8.w8a16.w8a16_kernel", "llm_kernels.activation._act_and_mul_kernel"):
        assert want in names


@pytest.mark.parametrize("name,kernel", KERNELS, ids=[n for n, _ in KERNELS])
def test_a_pdl_kernel_waits_first(name, kernel):
    fn = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn))).body[0]
    params = [a.arg for a in fn.args.args]
    if not kernel.pdl:
        assert "PDL" not in params, f"{name} declares PDL but is not built with pdl=True"
        return
    assert params[-1] == "PDL" and isinstance(fn.args.defaults[-1], ast.Constant) \
        and fn.args.defaults[-1].value is False, f"{name}: PDL must be the last parameter, default False"
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    first = body[0]
    assert isinstance(first, ast.If) and isinstance(first.test, ast.Name) and first.test.id == "PDL", \
        f"{name}: its first statement must be `if PDL:`"
    calls = [s.value.func.id for s in first.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    assert calls == ["gdc_wait", "gdc_launch_dependents"], f"{name}: `if PDL:` must wait, then release"


def test_the_launch_adds_pdl_only_where_it_is_on(monkeypatch):
    seen = []

    def launch(*args, **kwargs):
        seen.append(kwargs)

    dispatch._pdl_launcher(launch)(1, 2, num_warps=4)
    assert seen == [{"PDL": True, "launch_pdl": True, "num_warps": 4}]
    monkeypatch.setenv("LLM_KERNELS_PDL", "0")
    assert not pdl.pdl_on()
    assert pdl.pdl_for(90) == (pdl.gdc_wait is not None) and not pdl.pdl_for(89) and not pdl.pdl_for(80)
