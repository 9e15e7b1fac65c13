"""The two int4 peers of K1 (benchmarks/kernel_bench.py) besides cuBLAS, built from the same
unpacked int4 weights, zero points and bf16 scales as our AWQ layers, group G:

- tinygemm: PyTorch's own int4 GEMM (`torch._weight_int4pack_mm`, what gpt-fast uses).
  Its dequant is (q - 8) * scale + zero, so an AWQ zero point z becomes (8 - z) * scale.
- gemlite: mobiusml's Triton A16W4 kernels (`GemLiteLinear`), pure Python, carried to the
  device as source (`.whl/peers/gemlite`, put on sys.path by `load_gemlite`) with its
  shipped H100 configs loaded so it does not autotune for minutes.

Each builder returns a callable `f(x) -> y` or raises; K1 records the error instead.
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEMLITE_DIR = os.path.join(ROOT, ".whl", "peers")


def load_gemlite():
    """The gemlite module with its H100 configs loaded, or the reason it is not there."""
    if os.path.isdir(os.path.join(GEMLITE_DIR, "gemlite")) and GEMLITE_DIR not in sys.path:
        sys.path.insert(0, GEMLITE_DIR)
    try:
        import gemlite
        from gemlite import GemLiteLinear
        GemLiteLinear.load_config(os.path.join(os.path.dirname(gemlite.__file__), "configs", "h100.json"))
        return gemlite, None
    except Exception as e:  # noqa: BLE001 - any failure only means "no gemlite row"
        return None, repr(e)[:200]


def tinygemm(q: torch.Tensor, qz: torch.Tensor, sc: torch.Tensor, group: int):
    """q [K, N], qz [K/G, N] unpacked int4 values; sc [K/G, N] bf16."""
    wt = q.t().contiguous().to(torch.int32)
    w8 = ((wt[:, ::2] << 4) | wt[:, 1::2]).to(torch.uint8)  # [N, K/2], the even k in the high nibble
    packed = torch._convert_weight_to_int4pack(w8, 8)
    sz = torch.stack([sc, (8 - qz.to(torch.bfloat16)) * sc], dim=-1).contiguous()  # [K/G, N, 2]
    return lambda x: torch._weight_int4pack_mm(x, packed, group, sz)


def gemlite_linear(gemlite, q: torch.Tensor, qz: torch.Tensor, sc: torch.Tensor, group: int):
    K, N = q.shape
    layer = gemlite.GemLiteLinear(4, group_size=group, in_features=K, out_features=N,
                                  input_dtype=gemlite.DType.BF16, output_dtype=gemlite.DType.BF16)
    layer.pack(q.t().contiguous().to(torch.uint8), sc.t().contiguous(),
               qz.t().contiguous().to(torch.bfloat16), None)
    return layer


def build(gemlite, q, qz, sc, group):
    """{peer name: callable or the error string} for one weight set."""
    out = {}
    for name, make in (("tinygemm", lambda: tinygemm(q, qz, sc, group)),
                       ("gemlite", lambda: gemlite_linear(gemlite, q, qz, sc, group))):
        if name == "gemlite" and gemlite is None:
            continue
        try:
            out[name] = make()
        except Exception as e:  # noqa: BLE001
            out[name] = repr(e)[:200]
    return out
