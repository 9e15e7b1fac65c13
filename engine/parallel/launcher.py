"""Rank 0's side of tensor parallelism: checks the model splits evenly, spawns ranks
1..tp-1, joins the group with them (NCCL on CUDA, gloo on the CPU), talks through pipes."""
from __future__ import annotations

import contextlib
import logging
import pickle
import sys
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.distributed import TPGroup
from engine.errors import ModelLoadError, UnsupportedModelError
from engine.model.registry import model_class
from engine.parallel.worker import WorkerArgs, worker_main

log = logging.getLogger(__name__)

TIMEOUT_S = 600.0  # a collective waiting this long for a rank fails (NCCL: the watchdog ends the process)


def check_shardable(spec, size: int) -> None:
    """Raises UnsupportedModelError, naming the numbers, when the model does not
    split into `size` equal shards (its architecture's counts and split linears,
    with the units its quantization method packs them in)."""

    def need(n: int, what: str, unit: int = 1, why: str = ""):
        if n % (size * unit):
            per = f" ({n / size:g} per rank{why})" if unit > 1 else ""
            raise UnsupportedModelError(
                f"tensor_parallel_size={size} does not divide {what}={n}{per}"
                + ("; KV heads are not replicated across ranks" if what == "num_key_value_heads" else ""))

    counts, splits = model_class(spec.architecture).tp_rules(spec)
    for what, n in counts:
        need(n, what)
    for name, features, split in splits:
        if spec.quant is not None and spec.quant.covers(name):
            unit, why = spec.quant.tp_unit(split)
            need(features, f"{name.rsplit('.', 1)[1]} {'output' if split == 'column' else 'input'} features", unit, why)


class TPWorkers:
    """Ranks 1..size-1 (one process each, torch.multiprocessing spawn), started and joined
    into the default process group; close() (or garbage collection, or interpreter exit) stops them."""

    def __init__(self, size: int, device: str):
        self.size, self.device = size, device
        self.tp = TPGroup(0, size)
        self.procs: list = []
        self.conns: list = []
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns)

    @classmethod
    def start(cls, config, spec, path: str, max_positions: int, dtype, device: str) -> TPWorkers:
        size = config.tensor_parallel_size
        check_shardable(spec, size)
        cuda = device.startswith("cuda")
        if cuda:
            if torch.device(device).index not in (None, 0):
                raise ModelLoadError(f"tensor parallelism runs rank r on cuda:r; device {device!r} is not cuda:0 "
                                     "(choose the GPUs with CUDA_VISIBLE_DEVICES)")
            if torch.cuda.device_count() < size:
                raise ModelLoadError(f"tensor_parallel_size={size} needs {size} GPUs; "
                                     f"only {torch.cuda.device_count()} visible")
            torch.cuda.set_device(0)
        if dist.is_initialized():
            raise ModelLoadError("a tensor-parallel engine is already running in this process (one per process)")
        timeout = timedelta(seconds=TIMEOUT_S)
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False, timeout=timeout)
        self = cls(size, device)
        backend = "nccl" if cuda else "gloo"
        ctx = torch.multiprocessing.get_context("spawn")
        try:
            for rank in range(1, size):
                args = WorkerArgs(rank, size, store.port, backend, device, spec, path, dtype, max_positions,
                                  config.load_format, config.seed, TIMEOUT_S)
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=worker_main, args=(args, child), name=f"tp-rank{rank}", daemon=True)
                with _spawn_without_main():
                    proc.start()
                child.close()
                self.procs.append(proc)
                self.conns.append(parent)
            self.gather("hello")  # every rank is up before rank 0 waits for them in the group
            dist.init_process_group(backend, store=store, rank=0, world_size=size, timeout=timeout)
            log.info("tensor parallelism: %d ranks (%s), worker pids %s", size, backend, [p.pid for p in self.procs])
        except BaseException:
            self.close()
            raise
        return self

    # -- talking to the ranks ---------------------------------------------------------
    def send(self, *msg) -> None:
        """One message to every other rank, pickled once."""
        payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        for rank, conn in enumerate(self.conns, 1):
            try:
                conn.send_bytes(payload)
            except OSError as exc:
                raise ModelLoadError(f"tensor-parallel rank {rank} is gone: {self._exit(rank)}") from exc

    def gather(self, kind: str = "ok") -> list:
        """Each other rank's reply (waits; a rank's error or exit raises ModelLoadError)."""
        return [self._recv(rank, kind) for rank in range(1, self.size)]

    def _recv(self, rank: int, kind: str):
        conn, proc = self.conns[rank - 1], self.procs[rank - 1]
        while not conn.poll(0.05):
            if not proc.is_alive() and not conn.poll():
                raise ModelLoadError(f"tensor-parallel rank {rank} {self._exit(rank)}")
        try:
            got, value = conn.recv()
        except EOFError:
            raise ModelLoadError(f"tensor-parallel rank {rank} {self._exit(rank)}") from None
        if got == "error":
            log.error("tensor-parallel rank %d failed:\n%s", rank, value)
            raise ModelLoadError(f"tensor-parallel rank {rank} failed: {value.strip().splitlines()[-1]}")
        assert got == kind, (got, kind)
        return value

    def _exit(self, rank: int) -> str:
        proc = self.procs[rank - 1]
        proc.join(timeout=1.0)
        return f"exited (code {proc.exitcode})" if proc.exitcode is not None else "stopped answering"

    def errors(self) -> str:
        """What failed ranks said, without waiting long (for a step's error message)."""
        notes = []
        for rank, conn in enumerate(self.conns, 1):
            try:
                if conn.poll(0.5):
                    got, value = conn.recv()
                    if got == "error":
                        notes.append(f"rank {rank}: {value.strip().splitlines()[-1]}")
            except (EOFError, OSError):
                notes.append(f"rank {rank} {self._exit(rank)}")
        return "; ".join(notes)

    def check_alive(self) -> None:
        for rank, proc in enumerate(self.procs, 1):
            if not proc.is_alive():
                raise RuntimeError(f"tensor-parallel rank {rank} {self._exit(rank)}; the engine cannot go on")

    def runner(self, model, block_size: int, dtype, device, **kwargs):
        """Rank 0's runner, after every rank has loaded its shard; each rank builds its own."""
        from engine.parallel.runner import TPModelRunner

        self.gather("ready")
        return TPModelRunner(self, model, block_size, dtype, device, **kwargs)

    def close(self) -> None:
        """Stop the other ranks and leave the group. Idempotent."""
        self._finalizer()


@contextlib.contextmanager
def _spawn_without_main():
    """Spawned workers run engine code only: keep spawn from re-running the parent's
    __main__ in them (a script without a main guard, a script read from stdin)."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _shutdown(procs: list, conns: list) -> None:
    stop = pickle.dumps(("stop",))
    for conn in conns:
        try:
            conn.send_bytes(stop)
        except OSError:
            pass
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():  # stuck in a collective: rank 0 left it
            log.warning("tensor-parallel worker %s did not stop; terminating it", proc.pid)
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    log.info("tensor-parallel workers stopped (pids %s)", [p.pid for p in procs])
