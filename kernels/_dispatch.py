"""Chooses between a Triton kernel and the PyTorch reference for a call, and
builds Triton kernels lazily so the interpreter flag is read at launch time."""
import os

import torch


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(*tensors) -> bool:
    """Triton runs on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1."""
    if interpret_mode():
        return True
    return all(t.is_cuda for t in tensors)


class LazyKernel:
    """A `@triton.jit` kernel built at first launch, once per interpreter mode.

    triton reads TRITON_INTERPRET when a function is decorated; deferring the
    decoration lets one process run compiled kernels and interpreted ones
    (tests set the variable per test) whatever the import order was.
    """

    def __init__(self, fn):
        self.fn = fn
        self._built = {}

    def __getitem__(self, grid):
        mode = interpret_mode()
        kernel = self._built.get(mode)
        if kernel is None:
            import triton

            kernel = self._built[mode] = triton.jit(self.fn)
        if mode:
            return _interpreted_launcher(kernel[grid])
        return kernel[grid]


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
        import sys

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


def lazy_jit(fn) -> LazyKernel:
    return LazyKernel(fn)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


_TUNED: dict = {}


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


def autotune(name: str, key: tuple, configs: list, launch) -> dict:
    """Pick the fastest of `configs` for `key`, timing `launch(config)` from a
    CUDA graph once per key; the first config under the interpreter, or when
    called inside a graph capture before the key was tuned.

    launch must be safe to repeat (it rewrites its own outputs).
    """
    if interpret_mode() or len(configs) == 1:
        return configs[0]
    full = (name,) + tuple(key)
    best = _TUNED.get(full)
    if best is None:
        if torch.cuda.is_current_stream_capturing():
            return configs[0]
        from triton.runtime.errors import OutOfResources

        timings = []
        for cfg in configs:
            try:
                t = graph_time(lambda: launch(cfg))
            except OutOfResources:  # a config too big for the chip's shared memory
                t = float("inf")
            timings.append(t)
        best = configs[min(range(len(configs)), key=timings.__getitem__)]
        _TUNED[full] = best
    return best
