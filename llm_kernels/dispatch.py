"""How a kernel call runs: Triton or the PyTorch reference, kernels built at
launch in the interpreter mode of the call, and configs tuned once per shape."""
import os
import sys
from typing import Callable

import torch

from llm_kernels import tune_cache
from llm_kernels.pdl import pdl_on


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(*tensors) -> bool:
    """Triton runs on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1."""
    if interpret_mode():
        return True
    return all(t.is_cuda for t in tensors)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


_SMS: dict = {}


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 elsewhere (the interpreter),
    small so that tests exercise the split paths."""
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


# ----------------------------------------------------------------------------
# kernels built at launch

_HELPERS: dict = {}  # module name -> {name: plain function of a @jit_helper}
_HELPERS_BUILT: dict = {}  # (module name, mode) -> {name: the helpers built in that mode}


def _build(fn, mode: bool, **jit_kwargs):
    if mode:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn, **jit_kwargs)
    from triton.runtime.jit import JITFunction

    return JITFunction(fn, **jit_kwargs)


def jit_helper(fn):
    """A @triton.jit function that kernels of its module call. It is built at
    launch, in the launch's mode, and put in the module's globals, where the
    kernel finds it when it is traced (compiled) or run (interpreted)."""
    _HELPERS.setdefault(fn.__module__, {})[fn.__name__] = fn
    return fn


_USES: dict = {}  # module -> the modules whose @jit_helper functions its kernels call too


def uses_helpers_of(module: str, *others: str) -> None:
    """The kernels of `module` call @jit_helper functions of `others` too (imported by name):
    a launch builds those in its mode, in their own modules (where they call each other)
    and in `module`, before `module`'s own (which win a shared name)."""
    _USES.setdefault(module, []).extend(o for o in others if o not in _USES.get(module, []))


def _install_helpers(module: str, namespace: dict, mode: bool) -> None:
    for other in _USES.get(module, ()):
        _install_helpers(other, vars(sys.modules[other]), mode)
        namespace.update(_HELPERS_BUILT.get((other, mode), {}))
    helpers = _HELPERS.get(module)
    if not helpers:
        return
    built = _HELPERS_BUILT.get((module, mode))
    if built is None:
        built = _HELPERS_BUILT[(module, mode)] = {name: _build(fn, mode) for name, fn in helpers.items()}
    namespace.update(built)


class LazyKernel:
    """A @triton.jit kernel built at first launch, once per interpreter mode.

    triton reads TRITON_INTERPRET when a function is decorated; deferring the
    decoration lets one process run compiled kernels and interpreted ones
    (tests set the variable per test) whatever the import order was. The
    @jit_helper functions of the kernel's module are built in the same mode.
    """

    def __init__(self, fn, pdl: bool = False, **jit_kwargs):
        self.fn = fn
        self.pdl = pdl  # takes part in programmatic dependent launch (llm_kernels.pdl)
        self.jit_kwargs = jit_kwargs
        self._built = {}

    def built(self, mode: bool):
        """The kernel built in `mode` (True: interpreted), its module's helpers installed in that
        mode (a launch does this; llm_kernels.fp8.aot compiles the compiled-mode one for a target)."""
        _install_helpers(self.fn.__module__, self.fn.__globals__, mode)
        kernel = self._built.get(mode)
        if kernel is None:
            kernel = self._built[mode] = _build(self.fn, mode, **self.jit_kwargs)
        return kernel

    def __getitem__(self, grid):
        mode = interpret_mode()
        kernel = self.built(mode)
        if mode:
            return _interpreted_launcher(kernel[grid])
        if self.pdl and pdl_on():
            return _pdl_launcher(kernel[grid])
        return kernel[grid]


def lazy_jit(fn=None, **jit_kwargs):
    """`@lazy_jit` or `@lazy_jit(pdl=True, do_not_specialize=[...])`: a LazyKernel (pdl: the
    kernel takes part in programmatic dependent launch, llm_kernels.pdl)."""
    if fn is None:
        return lambda f: LazyKernel(f, **jit_kwargs)
    return LazyKernel(fn, **jit_kwargs)


def _pdl_launcher(launch):
    """A launch with programmatic dependent launch (llm_kernels.pdl): the kernel's PDL
    constexpr on, and the launch attribute."""
    def run(*args, **kwargs):
        return launch(*args, PDL=True, launch_pdl=True, **kwargs)

    return run


def _interpreted_launcher(launch):
    # num_warps / num_stages mean nothing to the interpreter
    def run(*args, num_warps=None, num_stages=None, **kwargs):
        with _interpreted_stdlib():
            return launch(*args, **kwargs)

    return run


_STDLIB_SWAP: list = []


class _interpreted_stdlib:
    """triton.language's own @jit helpers (tl.zeros, tl.sum, ...) are built
    when triton is imported; if that happened without TRITON_INTERPRET=1 they
    are compiled-mode functions the interpreter cannot call. Swap in
    interpreted twins for the launch and put the originals back after."""

    def __enter__(self):
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        if not _STDLIB_SWAP:
            for name, mod in list(sys.modules.items()):
                if mod is None or not name.startswith("triton.language"):
                    continue
                for attr, obj in list(vars(mod).items()):
                    if isinstance(obj, JITFunction):
                        _STDLIB_SWAP.append((mod, attr, obj, InterpretedFunction(obj.fn)))
        for mod, attr, _, twin in _STDLIB_SWAP:
            setattr(mod, attr, twin)

    def __exit__(self, *exc):
        for mod, attr, orig, _ in _STDLIB_SWAP:
            setattr(mod, attr, orig)


# ----------------------------------------------------------------------------
# tuning

_TUNED: dict = {}  # (name, *key) -> the chosen config
TIMINGS: dict = {}  # (name, *key) -> [(config, seconds per call)] of the tuning run
FAILED: dict = {}  # (name, config, *checked) -> why that config was left out


def graph_time(fn, calls: int = 10, reps: int = 7) -> float:
    """Median seconds per call of fn, replayed from a CUDA graph of `calls`
    back-to-back calls, so launch overhead on the host stays out of it."""
    fn()  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / calls)
    del graph
    return sorted(times)[len(times) // 2]


def l2_flush_buffer(device) -> torch.Tensor:
    """A buffer twice the L2 size: zeroing it before a timed call evicts the
    weights, as the engine's walk over all layers does (a layer that fits in L2
    would otherwise time hot)."""
    n = 2 * getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    return torch.empty(n, dtype=torch.uint8, device=device)


def config_key(cfg) -> tuple:
    return tuple(sorted(cfg.items())) if isinstance(cfg, dict) else (cfg,)


def chosen(name: str, key: tuple):
    """The config tuned for (name, key), or None before it was tuned."""
    return _TUNED.get((name,) + tuple(key))


def autotune(name: str, key: tuple, configs: list | Callable[[], list], launch: Callable, *,
             checked: tuple | None = None, cold_l2_device=None):
    """The fastest of `configs` (a list, or a function making it: called only
    until the key is tuned) for `key`, timing `launch(config)` from CUDA-graph
    replays once per key. The first config is the answer under the interpreter,
    and inside a graph capture before the key was tuned (then not kept). A
    choice an earlier process stored (tune_cache, once activated) is taken
    without timing, inside a capture too, while it is still among `configs`.

    checked: launch returns its output, and a config that fails to build or
    disagrees with the first that runs is left out, and remembered in FAILED
    under (name, config, *checked). Otherwise a config that needs more shared
    memory than the chip has times as infinite. cold_l2_device: each timed call
    follows an L2 flush, and the flush alone, timed the same way, is taken off.
    launch must be safe to repeat (it rewrites its own outputs).
    """
    if interpret_mode():
        return (configs() if callable(configs) else configs)[0]
    full = (name,) + tuple(key)
    best = _TUNED.get(full)
    if best is not None:
        return best
    configs = configs() if callable(configs) else configs
    if len(configs) == 1:
        return configs[0]
    stored = tune_cache.lookup(full, configs)  # chosen by an earlier process (llm_kernels/tune_cache.py)
    if stored is not None:
        _TUNED[full] = stored
        return stored
    if torch.cuda.is_current_stream_capturing():
        return configs[0]
    fail = None if checked is None else (lambda cfg: (name, config_key(cfg)) + tuple(checked))
    if fail is not None:
        configs = _agreeing(configs, launch, fail)
    timed = _time_configs(configs, launch, cold_l2_device, fail)
    TIMINGS[full] = timed
    best = min(timed, key=lambda ct: ct[1])[0] if timed else configs[0]
    _TUNED[full] = best
    tune_cache.record(full, best)
    return best


def _agreeing(configs: list, launch: Callable, fail: Callable) -> list:
    """The configs that build and agree with the first that runs (the yardstick)."""
    ok, ref = [], None
    for cfg in configs:
        if fail(cfg) in FAILED:
            continue
        try:
            out = launch(cfg).float()
        except Exception as exc:  # noqa: BLE001 - a config this compiler or chip rejects
            FAILED[fail(cfg)] = f"{type(exc).__name__}: {exc}"[:800]
            continue
        if ref is None:
            ref = out
        else:
            err = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            if not err < 2e-2:  # also catches NaN
                FAILED[fail(cfg)] = f"disagrees with {ok[0]}: rel err {err:.3g}"
                continue
        ok.append(cfg)
    return ok or configs[:1]


def _time_configs(configs: list, launch: Callable, cold_l2_device, fail) -> list:
    """[(config, seconds per call)], net of the L2 flush with cold_l2_device. With
    fail (checked configs), one that fails here is left out, in FAILED[fail(config)]."""
    from triton.runtime.errors import OutOfResources

    flush = None if cold_l2_device is None else l2_flush_buffer(cold_l2_device)
    flush_times, timed = [], []
    for cfg in configs:
        try:
            if flush is None:
                t = graph_time(lambda c=cfg: launch(c))
            else:  # the flush alone, next to each candidate: same clocks, same memory state
                flush_times.append(graph_time(flush.zero_))
                t = graph_time(lambda c=cfg: (flush.zero_(), launch(c)))
        except OutOfResources:  # a config too big for the chip's shared memory
            t = float("inf")
        except Exception as exc:  # noqa: BLE001 - see fail above
            if fail is None:
                raise
            FAILED[fail(cfg)] = f"{type(exc).__name__}: {exc}"[:800]
            continue
        timed.append((cfg, t))
    if flush_times:
        flush_only = sorted(flush_times)[len(flush_times) // 2]
        timed = [(cfg, t - flush_only) for cfg, t in timed]
    return timed
