"""The vocabulary-parallel embedding table: under tensor parallelism each rank
holds a slice of the rows, for the token embedding and for the lm_head."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import llm_kernels
from engine.distributed import TPGroup


class VocabParallelEmbedding(nn.Module):
    """Rows [rank*n, (rank+1)*n) of a [vocab, hidden] table (n = vocab / tp rounded
    up; the last rank's spare rows stay zero): the embedding (each rank looks up its
    rows, the sum over ranks is the lookup), and the lm_head (each rank's logits,
    gathered side by side)."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype, device, tp: TPGroup):
        super().__init__()
        assert tp.size > 1
        self.vocab_size, self.hidden_size, self.tp = vocab_size, hidden_size, tp
        self.per_rank = -(-vocab_size // tp.size)
        self.start = tp.rank * self.per_rank
        self.weight = nn.Parameter(torch.zeros(self.per_rank, hidden_size, dtype=dtype, device=device),
                                   requires_grad=False)
        self.loaded: set[tuple[int, str]] = set()

    def load(self, shard: int, name: str, tensor: torch.Tensor):
        if name != "weight":
            raise KeyError(name)
        if tuple(tensor.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, "
                             f"expected {(self.vocab_size, self.hidden_size)}")
        part = tensor[self.start : self.start + self.per_rank]
        self.weight.data[: part.shape[0]].copy_(part)
        self.loaded.add((shard, name))

    def expected(self) -> set[tuple[int, str]]:
        return {(0, "weight")}

    def finalize(self):
        pass

    def forward(self, ids):
        local = ids - self.start
        inside = (local >= 0) & (local < self.per_rank)
        x = F.embedding(local.masked_fill(~inside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill_(~inside.unsqueeze(-1), 0))

    def logits(self, hidden):
        return self.tp.all_gather(llm_kernels.dense_linear(hidden, self.weight))[..., : self.vocab_size]
