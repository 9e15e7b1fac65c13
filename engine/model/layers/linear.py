"""Linear layers over merged shards (q,k,v / gate,up), their weights made by a
LinearMethod (dense here, or a quantization method), split for tensor parallelism."""
from __future__ import annotations

import torch
from torch import nn

import llm_kernels
from engine.model.layers.attention import get_forward_context
from engine.distributed import SINGLE, TPGroup
from engine.quant import LinearMethod, QuantMethod

FUSED = "fused"  # the shard of a checkpoint tensor that holds every merged shard (Phi-3's qkv_proj)


class Dense(LinearMethod):
    """Unquantized: weight [N, K] and bias [N] in the model's dtype."""

    tp_dims = {"weight": (0, 1), "bias": (0, None)}

    def create_weights(self, layer, bias: bool, dtype, device) -> None:
        n = sum(layer.output_sizes)
        layer.weight = nn.Parameter(torch.empty(n, layer.in_features, dtype=dtype, device=device), requires_grad=False)
        layer.bias = nn.Parameter(torch.zeros(n, dtype=dtype, device=device), requires_grad=False) if bias else None

    def tensor_names(self, layer) -> list[str]:
        return ["weight"] + (["bias"] if layer.bias is not None else [])

    def load(self, layer, shard: int, name: str, tensor: torch.Tensor) -> None:
        off, size = layer.shard_offset(shard), layer.output_sizes[shard]
        param = {"weight": layer.weight, "bias": layer.bias}.get(name)
        if param is None:
            raise KeyError(name)
        want = (size, layer.in_features) if name == "weight" else (size,)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, expected {want}")
        param.data[off : off + size].copy_(tensor)

    def apply(self, layer, x, bias):
        return llm_kernels.dense_linear(x, layer.weight, bias)


DENSE = Dense()


class Linear(nn.Module):
    """y = x W^T + b; output_sizes > 1 merges several projections. Sizes are the
    checkpoint's; under tensor parallelism (tp.size > 1) split "column" keeps this
    rank's 1/tp of every merged shard's outputs, "row" its 1/tp of the inputs,
    all-reducing the output (the bias added once, after)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, dtype, device,
                 tp: TPGroup = SINGLE, split: str | None = None, method: LinearMethod | None = None):
        super().__init__()
        self.tp, self.split, self.method = tp, (split if tp.size > 1 else None), method or DENSE
        if self.split == "column":
            output_sizes = [tp.part(s, "output features") for s in output_sizes]
        elif self.split == "row":
            in_features = tp.part(in_features, "input features")
        self.in_features, self.output_sizes = in_features, list(output_sizes)
        self.method.create_weights(self, bias, dtype, device)
        self.loaded: set[tuple[int, str]] = set()
        self.lora = None  # engine.lora.slots.LoRAWeights when adapters may change this linear

    def shard_offset(self, shard: int) -> int:
        return sum(self.output_sizes[:shard])

    def load(self, shard: int | str, name: str, tensor: torch.Tensor) -> None:
        """One checkpoint tensor of merged shard `shard` (this rank's part of it is kept);
        shard FUSED: the tensor holds every shard, side by side along the output features."""
        if shard == FUSED:
            self._load_fused(name, tensor)
            return
        dims = self.method.tp_dims.get(name)
        if self.split is not None and dims is not None:
            dim = dims[0 if self.split == "column" else 1]
            tensor = tensor if dim is None else self.tp.shard(tensor, dim, name)
        self.method.load(self, shard, name, tensor)
        self.loaded.add((shard, name))

    def _load_fused(self, name: str, tensor: torch.Tensor) -> None:
        """Cut a fused checkpoint tensor into its shards (in proportion to output_sizes
        along the format's output dim, so packed formats cut in packed units)."""
        dims = self.method.tp_dims.get(name)
        dim = dims[0] if dims is not None else None
        if dim is None:
            raise KeyError(name)
        total = sum(self.output_sizes)
        if tensor.shape[dim] * self.output_sizes[0] % total:
            raise ValueError(f"{name}: fused checkpoint shape {tuple(tensor.shape)} does not split "
                             f"into {self.output_sizes}")
        sizes = [tensor.shape[dim] * s // total for s in self.output_sizes]
        if sum(sizes) != tensor.shape[dim]:
            raise ValueError(f"{name}: fused checkpoint shape {tuple(tensor.shape)} does not split "
                             f"into {self.output_sizes}")
        for i, part in enumerate(tensor.split(sizes, dim=dim)):
            self.load(i, name, part)

    def expected(self) -> set[tuple[int, str]]:
        names = self.method.tensor_names(self)
        return {(s, n) for s in range(len(self.output_sizes)) for n in names}

    def finalize(self) -> None:
        self.method.finalize(self)

    def forward(self, x):
        if self.split == "row":
            y = self.tp.all_reduce(self.method.apply(self, x, None))
            y = y + self.bias if self.bias is not None else y
        else:
            y = self.method.apply(self, x, self.bias)
        if self.lora is not None:
            slots = get_forward_context().lora_slots
            if slots is not None:  # each token's adapter update, beside the (quantized or dense) base
                llm_kernels.add_lora(y, x, self.lora.a, self.lora.b, slots, self.lora.output_slices)
        return y


def make_linear(quant: QuantMethod | None, prefix: str, in_features: int, output_sizes: list[int], bias: bool,
                dtype, device, tp: TPGroup = SINGLE, split: str | None = None) -> Linear:
    """The linear of checkpoint name `prefix`: its weights the quantization method's
    when the method covers it, dense otherwise."""
    method = quant if quant is not None and quant.covers(prefix) else None
    return Linear(in_features, output_sizes, bias, dtype, device, tp, split, method)
