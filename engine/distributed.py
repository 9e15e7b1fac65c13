"""This process's place in tensor parallelism: its rank, the group size, and the
collectives the sharded layers call. The single-process default never calls one."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    group: object = None  # a torch.distributed ProcessGroup; None: the default group

    def part(self, n: int, what: str) -> int:
        """This rank's share of n (n must divide evenly)."""
        if n % self.size:
            raise ValueError(f"{what} ({n}) is not divisible by tensor_parallel_size {self.size}")
        return n // self.size

    def shard(self, tensor: torch.Tensor, dim: int, what: str) -> torch.Tensor:
        """This rank's contiguous 1/size slice of a checkpoint tensor along dim."""
        n = self.part(tensor.shape[dim], f"{what}: checkpoint dim {dim}")
        return tensor.narrow(dim, self.rank * n, n)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place."""
        assert self.size > 1
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """The ranks' tensors side by side along the last dim, in rank order."""
        assert self.size > 1
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE = TPGroup()
