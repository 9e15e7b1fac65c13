"""Rank 0's ModelRunner under tensor parallelism: a local ModelRunner on rank 0's
shard; whatever runs the model is sent to the other ranks first, so the collectives pair up."""
from __future__ import annotations

import torch

from engine.errors import ModelLoadError
from engine.parallel.step import StepEncoder
from engine.runner import ModelRunner


class TPModelRunner:
    """The engine's runner interface over engine.runner.ModelRunner; steps, KV cache
    allocation, profiling and CUDA graph capture run on every rank at once."""

    def __init__(self, workers, model, block_size: int, dtype, device, **kwargs):
        self.workers = workers
        self.encoder = StepEncoder()
        workers.send("runner", block_size, kwargs)
        self.local = ModelRunner(model, block_size, dtype, device, **kwargs)
        workers.gather()

    def __getattr__(self, name):  # what the engine reads of its runner: model, device, caches, graphs, ...
        if name in ("local", "workers", "encoder"):
            raise AttributeError(name)
        return getattr(self.local, name)

    def _everywhere(self, name: str, *args, **kwargs):
        """Rank 0's result of runner.name(*args) and the other ranks' results."""
        self.workers.send("call", name, args, kwargs)
        try:
            mine = getattr(self.local, name)(*args, **kwargs)
        except Exception as exc:
            notes = self.workers.errors()
            if notes:
                raise ModelLoadError(f"{name} failed under tensor parallelism: {notes}") from exc
            raise
        return mine, self.workers.gather()

    def allocate_kv_cache(self, num_blocks: int):
        """The same number of blocks on every rank, each of its own KV heads."""
        self._everywhere("allocate_kv_cache", num_blocks)

    def free_kv_cache(self):
        self._everywhere("free_kv_cache")

    def scrub_kv(self, block_ids: list[int]) -> None:
        """Expired blocks zeroed on every rank (each holds its own KV heads of them)."""
        self._everywhere("scrub_kv", block_ids)

    def profile_peak_bytes(self, num_tokens: int, num_seqs: int) -> int:
        mine, others = self._everywhere("profile_peak_bytes", num_tokens, num_seqs)
        return max([mine, *others])

    def capture_graphs(self, max_batch: int, max_mixed_tokens: int = 0):
        """Each rank captures its decode graphs (NCCL collectives inside), in the same order.
        Mixed-step graphs are not captured under tensor parallelism (those steps run eagerly)."""
        self.workers.send("graphs", max_batch)
        self.local.capture_graphs(max_batch)
        self.workers.gather()

    def execute(self, scheduled, **kwargs) -> torch.Tensor:
        """Logits [S, vocab] float32, from rank 0 (the vocab-parallel lm_head gathers them)."""
        self.workers.check_alive()
        items, gone = self.encoder.encode(scheduled)
        self.workers.send("step", items, gone, kwargs)
        try:
            return self.local.execute(scheduled, **kwargs)
        except torch.OutOfMemoryError as exc:  # the other ranks may be inside a collective now
            raise RuntimeError("out of memory on rank 0 under tensor parallelism: the ranks are out of step "
                               "and the engine cannot go on") from exc
        except Exception as exc:
            notes = self.workers.errors()
            if notes:
                raise RuntimeError(f"tensor-parallel step failed: {notes}") from exc
            raise
