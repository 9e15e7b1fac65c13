"""The architectures we run: config.json's architectures[0] -> its model class.
Adding one is a file (engine/model/<family>.py) and a line in ARCHITECTURES."""
from __future__ import annotations

from typing import Protocol

import torch

from engine.distributed import TPGroup
from engine.errors import UnsupportedModelError
from engine.model.gemma3 import Gemma2ForCausalLM, Gemma3ForCausalLM
from engine.model.llama import LlamaForCausalLM
from engine.model.phi3 import Phi3ForCausalLM
from engine.model.qwen2 import Qwen2ForCausalLM
from engine.model.qwen3 import Qwen3ForCausalLM
from engine.model.qwen3_moe import Qwen3MoeForCausalLM
from engine.model.spec import ModelSpec, TPSplit


class CausalLM(Protocol):
    """What the loader, the runner and tensor parallelism ask of a model class.
    Linears are engine.model.layers.Linear (their weights from spec.quant, or dense),
    attention is engine.model.layers.PagedAttention."""

    # checkpoint projection -> (our merged module, shard): fused weights, e.g. q_proj -> (qkv_proj, 0)
    packed_modules_mapping: dict[str, tuple[str, int]]
    spec: ModelSpec  # this rank's: heads and KV heads its own under tensor parallelism

    @classmethod
    def spec_from_config(cls, cfg) -> ModelSpec:
        """The transformers config read, with the family's quirks; UnsupportedModelError
        for what it cannot run (quantization is the loader's)."""

    @classmethod
    def tp_rules(cls, spec: ModelSpec) -> tuple[list[tuple[str, int]], list[TPSplit]]:
        """What must split evenly over the ranks: (name, count) pairs, and the split linears of a layer."""

    def __init__(self, spec: ModelSpec, dtype, device, max_positions: int, tp: TPGroup): ...

    def checkpoint_name(self, name: str) -> str | None:
        """Our name of a checkpoint tensor (renames; None: not loaded)."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


ARCHITECTURES: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,  # every layer sliding when sliding_window is set
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
}


def model_class(architecture: str | None) -> type[CausalLM]:
    """The class of an architecture; UnsupportedModelError listing those we run."""
    if architecture not in ARCHITECTURES:
        raise UnsupportedModelError(f"architecture {architecture!r} is not supported ({sorted(ARCHITECTURES)})")
    return ARCHITECTURES[architecture]
