"""The seam between a linear layer and the format of its weights: a LinearMethod
creates, loads, prepares and applies them; a QuantMethod is one read from a checkpoint."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch


class LinearMethod(ABC):
    """How one format's weights live in an engine.model.layers.Linear. The layer
    (in_features, output_sizes: this rank's part of each merged shard) holds them
    as attributes; it slices each checkpoint tensor for tensor parallelism by
    `tp_dims` before `load` sees it, and adds the bias of a row split itself."""

    # checkpoint tensor -> (the dim a column split cuts, the dim a row split cuts); None: replicated
    tp_dims: ClassVar[dict[str, tuple[int, int | None]]] = {}

    @abstractmethod
    def create_weights(self, layer, bias: bool, dtype, device) -> None:
        """Register the layer's tensors (the bias as layer.bias, None without one)."""

    @abstractmethod
    def tensor_names(self, layer) -> list[str]:
        """The checkpoint tensors each merged shard of the layer needs."""

    @abstractmethod
    def load(self, layer, shard: int, name: str, tensor: torch.Tensor) -> None:
        """Copy this rank's part of one checkpoint tensor of a shard; KeyError for a
        name the format lacks, ValueError for a shape it does not expect."""

    def finalize(self, layer) -> None:
        """After every tensor is loaded: repack for the kernels."""

    @abstractmethod
    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T (+ bias)."""


class QuantMethod(LinearMethod):
    """A quantization method read from config.json's quantization_config: which
    linears it covers (the others stay dense) and what tensor parallelism needs."""

    name: ClassVar[str]  # quant_method in config.json

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict) -> QuantMethod:
        """Parse quantization_config; UnsupportedModelError naming what is not supported."""

    @abstractmethod
    def covers(self, prefix: str) -> bool:
        """Whether the linear of this checkpoint name is quantized."""

    @abstractmethod
    def tp_unit(self, split: str) -> tuple[int, str]:
        """(the unit each rank's features must be a multiple of, why) for a "column"
        (output features) or "row" (input features) split."""
