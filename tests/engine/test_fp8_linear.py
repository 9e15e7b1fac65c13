"""The engine's FP8 linear (compressed-tensors' FP8 schemes and quant_method "fp8") on the
kernels of llm_kernels.fp8: under the Triton interpreter (the GPU's kernels) the layer keeps its
e4m3 weight alone and a decode step runs the weight-only kernel, equal to the float32 product
with the dequantized weight; on the CPU the weight is dequantized at load and the fp8 copy goes."""
import pytest
import torch

from engine.model.layers import Linear
from engine.quant.compressed_tensors import CompressedTensors
from engine.quant.fp8 import FP8Method, FP8Scheme
from llm_kernels.fp8 import FP8, dequantize_fp8, plan

K, SIZES = 96, [64, 32]


def methods():
    return {"ct-channel": CompressedTensors(8, -1, True, False, FP8Scheme("channel", None, True)),
            "ct-weight-only": CompressedTensors(8, -1, True, False, FP8Scheme("channel", None, False)),
            "fp8-tensor": FP8Method(FP8Scheme("tensor")),
            "fp8-block": FP8Method(FP8Scheme("block", (32, 32), True, "weight_scale_inv"))}


def build(name, dtype):
    """A merged two-shard layer loaded from random checkpoint tensors, and its dequantized weight."""
    method, g = methods()[name], torch.Generator().manual_seed(7)
    layer = Linear(K, SIZES, True, dtype, "cpu", method=method)
    weights = []
    for shard, n in enumerate(SIZES):
        q = (torch.randn(n, K, generator=g) * 100).clamp(-448, 448).to(FP8)
        scheme = method.scheme if isinstance(method, FP8Method) else method.fp8
        if scheme.strategy == "block":
            s = torch.rand(n // 32, K // 32, generator=g) * 0.01
        elif scheme.strategy == "tensor":
            s = torch.rand(1, generator=g) * 0.01
        else:
            s = torch.rand(n, 1, generator=g) * 0.01
        layer.load(shard, "weight", q)
        layer.load(shard, scheme.scale_name, s)
        layer.load(shard, "bias", torch.randn(n, generator=g))
        weights.append(dequantize_fp8(q, s.reshape(-1) if scheme.block is None else s, scheme.block))
    layer.finalize()
    return layer, torch.cat(weights)


@pytest.mark.parametrize("name", ["ct-channel", "ct-weight-only", "fp8-tensor", "fp8-block"])
def test_decode_runs_the_weight_only_kernel_on_the_fp8_weight(monkeypatch, name):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    layer, w = build(name, torch.float16)
    assert layer.fp8.dense is None and layer.fp8.weight is layer.weight and layer.weight.dtype == FP8
    x = torch.randn(2, 3, K, dtype=torch.float16)
    assert plan(x.reshape(-1, K), layer.fp8)[0] == "w8a16"
    ref = x.float() @ w.t() + layer.bias.float()
    err = ((layer(x).float() - ref).norm() / ref.norm()).item()
    assert err < 4e-3, err


@pytest.mark.parametrize("name", ["ct-channel", "fp8-block"])
def test_cpu_dequantizes_at_load_and_drops_the_fp8_copy(monkeypatch, name):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    layer, w = build(name, torch.float32)
    assert layer.fp8.weight is None and layer.weight.numel() == 0
    assert torch.allclose(layer.fp8.dense, w)
