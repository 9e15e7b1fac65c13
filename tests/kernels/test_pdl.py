"""Programmatic dependent launch (llm_kernels.pdl): every kernel built with @lazy_jit(pdl=True)
declares `PDL: tl.constexpr = False` and, before anything else, waits for the previous kernel
(gdc_wait) and lets the next one start (gdc_launch_dependents), so no program of it reads
another kernel's output early or exits before the kernel it depends on is done; the launch adds
PDL and launch_pdl only where pdl_on says so (never in the interpreter or without a GPU).
The LoRA kernels wait late (llm_kernels.lora.kernels): each program waits, then releases,
before every store, every return and every read of y (the output of the launch before)."""
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


LATE_WAIT = {"llm_kernels.lora.kernels._shrink_kernel", "llm_kernels.lora.kernels._expand_kernel",
             "llm_kernels.lora.onehot._shrink_onehot_kernel", "llm_kernels.lora.onehot._expand_onehot_kernel"}


def _call_name(node) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _waits_before(body: list, what) -> None:
    """Walks statements in order: each one `what` flags needs a wait_then_release(PDL) earlier
    in its own block or an enclosing one."""
    waited = False
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _call_name(stmt.value) == "wait_then_release":
            waited = True
            continue
        if not waited:
            inner = [b for field in ("body", "orelse") for b in [getattr(stmt, field, None)] if b]
            flagged = what(stmt) if not inner else what(ast.Module(body=[s for s in ast.iter_child_nodes(stmt)
                                                                          if not isinstance(s, ast.stmt)],
                                                               type_ignores=[]))
            assert not flagged, f"line {stmt.lineno}: {flagged} before the wait"
            for block in inner:
                _waits_before(block, what)


def _late_flags(stmt) -> str:
    """What must not come before the wait in a late-waiting kernel: a return, a store, an
    atomic, finish_shrink (stores), a load of y."""
    if isinstance(stmt, ast.Return):
        return "a return"
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in ("store", "atomic_add", "atomic_xchg", "finish_shrink"):
                return name
            if name == "load" and any(isinstance(n, ast.Name) and n.id in ("y_ptr", "y_ptrs") for n in ast.walk(node)):
                return "a load of y"
    return ""


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
    if name in LATE_WAIT:
        _waits_before(body, _late_flags)
        return
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


def test_the_late_wait_check_finds_what_comes_early():
    early = ast.parse(textwrap.dedent("""
        def k(y_ptr, PDL):
            a = tl.load(x_ptr)
            if a > 0:
                tl.store(o_ptr, a)
            wait_then_release(PDL)
        """)).body[0]
    with pytest.raises(AssertionError, match="store before the wait"):
        _waits_before(early.body, _late_flags)
    for line in ("return", "b = tl.load(y_ptrs + 1)", "finish_shrink(a)"):
        bad = ast.parse(textwrap.dedent(f"""
            def k(y_ptr, PDL):
                if c:
                    {line}
                wait_then_release(PDL)
            """)).body[0]
        with pytest.raises(AssertionError, match="before the wait"):
            _waits_before(bad.body, _late_flags)
    good = ast.parse(textwrap.dedent("""
        def k(y_ptr, PDL):
            a = tl.load(x_ptr)
            if c:
                wait_then_release(PDL)
                return
            wait_then_release(PDL)
            tl.store(o_ptr, tl.load(y_ptr))
        """)).body[0]
    _waits_before(good.body, _late_flags)
