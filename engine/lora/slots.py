"""The adapters' weights on the device: for each target linear, A [S, shards * R, K] and
B [S, N, R] over S = max_loras slots, R = max_lora_rank. A merged linear (q/k/v, gate/up)
gives each shard its own R rows of A and its output rows of B (the merged update's block
diagonal without its zeros, llm_kernels.lora.add_lora's output_slices): one shrink and one
expand serve the merged output. A checkpoint's fused pair (one A over all shards) goes into
every shard's rows alike, which gives the same update. A slot's unused ranks and shards are
zeros, so every slot runs the same shapes (and CUDA graphs)."""
from __future__ import annotations

import torch

from engine.lora.adapter import LoRAAdapter
from engine.lora.targets import LoRATargets
from engine.model.layers.linear import FUSED


class LoRAWeights:
    """One linear's slots (the linear's `lora` attribute, read by its forward)."""

    __slots__ = ("a", "b", "rank", "output_slices")

    def __init__(self, linear, num_slots: int, rank: int, dtype, device):
        self.output_slices = tuple(linear.output_sizes)
        self.rank = rank
        self.a = torch.zeros(num_slots, len(self.output_slices) * rank, linear.in_features, dtype=dtype, device=device)
        self.b = torch.zeros(num_slots, sum(self.output_slices), rank, dtype=dtype, device=device)


class LoRASlots:
    """Every target linear's slots; write(slot, adapter) puts an adapter in a slot."""

    def __init__(self, targets: LoRATargets, num_slots: int, max_rank: int, dtype, device):
        self.num_slots, self.max_rank = num_slots, max_rank
        self.weights: dict[str, LoRAWeights] = {}
        for name, linear in targets.linears.items():
            linear.lora = self.weights[name] = LoRAWeights(linear, num_slots, max_rank, dtype, device)
        self.linears = targets.linears

    @property
    def nbytes(self) -> int:
        return sum(w.a.numel() * w.a.element_size() + w.b.numel() * w.b.element_size() for w in self.weights.values())

    @torch.inference_mode()
    def write(self, slot: int, adapter: LoRAAdapter) -> None:
        """The adapter's pairs into `slot`; every linear it does not change gets zeros there."""
        for w in self.weights.values():
            w.a[slot].zero_()
            w.b[slot].zero_()
        for (name, shard), (a, b) in adapter.pairs.items():
            w, linear = self.weights[name], self.linears[name]
            r = a.shape[0]
            for i in range(len(w.output_slices)) if shard == FUSED else (shard,):
                rows = slice(linear.shard_offset(i), linear.shard_offset(i) + linear.output_sizes[i])
                w.a[slot, i * self.max_rank : i * self.max_rank + r].copy_(a, non_blocking=True)
                w.b[slot, rows, :r].copy_(b if shard != FUSED else b[rows], non_blocking=True)
