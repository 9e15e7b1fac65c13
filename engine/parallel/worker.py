"""A tensor-parallel worker process (ranks 1..tp-1): joins the group, loads its shard,
then runs what rank 0 sends through its pipe (its ModelRunner, calls on every rank, steps)."""
from __future__ import annotations

import logging
import os
import pickle
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch

from engine.model.spec import ModelSpec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkerArgs:
    rank: int
    size: int
    port: int  # rank 0's TCPStore
    backend: str  # "nccl" | "gloo"
    device: str  # "cpu" or "cuda"; rank r runs on cuda:r
    spec: ModelSpec  # of the whole model
    model_path: str
    dtype: torch.dtype
    max_positions: int
    load_format: str
    seed: int
    timeout_s: float


def rank_device(device: str, rank: int) -> str:
    return f"cuda:{rank}" if device.startswith("cuda") else device


def worker_main(args: WorkerArgs, conn) -> None:
    """Entry point of the spawned process. Any failure is reported through the pipe
    and ends the process (the group's other ranks then fail their collectives)."""
    try:
        import torch.distributed as dist

        from engine.distributed import TPGroup
        from engine.model.loader import load_model

        device = rank_device(args.device, args.rank)
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        else:  # the ranks share the host's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.size))
        conn.send(("hello", os.getpid()))
        timeout = timedelta(seconds=args.timeout_s)
        store = dist.TCPStore("127.0.0.1", args.port, args.size, is_master=False, timeout=timeout)
        dist.init_process_group(args.backend, store=store, rank=args.rank, world_size=args.size, timeout=timeout)
        tp = TPGroup(args.rank, args.size)
        model = load_model(args.spec, args.model_path, args.dtype, device, max_positions=args.max_positions,
                           load_format=args.load_format, seed=args.seed, tp=tp)
        conn.send(("ready", None))
        _serve(conn, model, device, args)
    except (EOFError, BrokenPipeError):
        os._exit(0)  # rank 0 is gone: nothing to report to
    except BaseException:  # noqa: BLE001 - reported to rank 0, then the process ends
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        os._exit(1)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _serve(conn, model, device: str, args: WorkerArgs) -> None:
    from engine.parallel.step import StepDecoder
    from engine.runner import ModelRunner

    runner = None
    decoder = StepDecoder()
    while True:
        op, *rest = pickle.loads(conn.recv_bytes())
        if op == "step":  # the hot path: no reply, the collectives keep the ranks in step
            items, gone, kwargs = rest
            runner.execute(decoder.decode(items, gone), **kwargs)
        elif op == "runner":
            block_size, kwargs = rest
            runner = ModelRunner(model, block_size, args.dtype, device, **kwargs)
            conn.send(("ok", None))
        elif op == "call":
            name, a, kw = rest
            conn.send(("ok", getattr(runner, name)(*a, **kw)))
        elif op == "graphs":
            runner.capture_graphs(rest[0])
            conn.send(("ok", None))
        elif op == "stop":
            return
        else:
            raise ValueError(f"unknown operation {op!r}")
