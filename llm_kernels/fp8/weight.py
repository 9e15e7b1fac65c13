"""An FP8 linear layer prepared for its device (`prepare`) and x W^T computed by the kernel
llm_kernels.fp8.select names for the step (`linear`): the one place that tells CUDA, the
Triton interpreter and the CPU apart.

On a GPU the layer holds the checkpoint's e4m3 weight [N, K] and nothing else of its size:
the W8A16 kernel streams it as it is, torch._scaled_mm reads it as a [K, N] column-major view,
and the dequantize-then-cuBLAS path makes a 16-bit copy for the call only. On the CPU it
holds the weight dequantized at load alone (the fp8 bytes go).

What each kernel computes: `w8a16` the weight-only product x @ dequant(W)^T (16-bit x,
float32 sums); `scaled_mm` the W8A8 product, x quantized per token to e4m3 first; the
others (`dequant_matmul`, `dense`, `reference`) x quantized as the layer's scheme says
(`act`: per token, per token and group, or not at all) times the dequantized weight. So
a layer whose scheme quantizes activations differs between the weight-only kernel (small
token counts) and the others by the activation's e4m3 rounding (about 2-3% of the output's
norm); the weight-only product is the nearer to the unquantized model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from llm_kernels.dense import dense_linear
from llm_kernels.dispatch import autotune, chosen, interpret_mode
from llm_kernels.fp8 import dequant, w8a16
from llm_kernels.fp8.act_quant import quantize_per_token
from llm_kernels.fp8.configs import DENSE, SCALED_MM, shape_key, w8a8_configs, w8a16_configs
from llm_kernels.fp8.reference import dequantize_fp8, quantize_activations
from llm_kernels.fp8.select import BLOCK, CHANNEL, HOST, SCALED, candidates, device_class
from llm_kernels.w4a16.workspace import workspace

TUNED_KERNEL = "fp8_w8a16"  # the tuner's name of the W8A16 kernel's configs
TUNED_A8 = "fp8_w8a8"  # of the W8A8 kernel's
TUNED_PATH = "fp8_linear"  # and of the choice between the kernels a step can run
KIND_TO_KERNEL = {"w8a16": "w8a16", "w8a8": "w8a8", "scaled_mm": "scaled_mm", "dense": "dequant_matmul"}
A8_KERNELS = ("w8a8", "scaled_mm")  # the kernels that take activations quantized per token


@dataclass
class FP8Weight:
    """One FP8 layer in one layout (llm_kernels.fp8.select names them). SCALED, CHANNEL and
    BLOCK hold `weight` e4m3 [N, K] and `scale` float32: [N] per channel, or for BLOCK
    [cdiv(N, bn), cdiv(K, bk)] with `block` (bn, bk) (bn 1: one scale row per output row,
    where merged shards do not start on whole blocks). HOST holds `dense` [N, K] in the
    model's dtype. `act`: "token", "group" (of `group` features) or None. `fed`: the kernel
    that produces the layer's input can also quantize it per token in its own launch
    (wants_quantized_input marks it): the choice between the kernels is then timed with W8A8's
    activations quantized beforehand, and tuned apart from the same shape unfed."""

    layout: str
    in_features: int
    out_features: int
    act: str | None
    group: int = 0
    weight: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    block: tuple | None = None
    dense: torch.Tensor | None = None
    fed: bool = False
    wants: dict = field(default_factory=dict)  # token count -> wants_quantized_input's settled answer


def default_layout(device: torch.device, K: int, N: int, act: str | None, block) -> str:
    """E4M3 layouts where the Triton kernels run (a GPU, the interpreter): SCALED where
    torch._scaled_mm could take the layer, BLOCK for block scales a dot can step through
    (width a multiple of 16), CHANNEL otherwise; HOST on the CPU."""
    if not (device.type == "cuda" or interpret_mode()):
        return HOST
    if block is not None:
        return BLOCK if block[1] % 16 == 0 else HOST
    return SCALED if act == "token" and K % 16 == 0 and N % 16 == 0 else CHANNEL


def _block_scales(scale: torch.Tensor, block: tuple, shard_sizes: list[int]) -> tuple[torch.Tensor, tuple]:
    """Block scales of merged shards (each with its own edge blocks) as the kernels index
    them: unchanged where every shard but the last is whole blocks, else one row per output row."""
    bn, bk = block
    if all(size % bn == 0 for size in shard_sizes[:-1]):
        return scale.float().contiguous(), block
    rows, out = 0, []
    for size in shard_sizes:
        nb = -(-size // bn)
        out.append(scale[rows : rows + nb].float().repeat_interleave(bn, 0)[:size])
        rows += nb
    return torch.cat(out).contiguous(), (1, bk)


def _host_dense(weight, scale, block, shard_sizes, dtype) -> torch.Tensor:
    """The dequantized [N, K] weight in dtype, block scales shard by shard (their own edge blocks)."""
    if block is None:
        return dequantize_fp8(weight, scale, dtype=dtype)
    bn, rows, off, ws = block[0], 0, 0, []
    for size in shard_sizes:
        nb = -(-size // bn)
        ws.append(dequantize_fp8(weight[off : off + size], scale[rows : rows + nb], block, dtype))
        rows, off = rows + nb, off + size
    return torch.cat(ws)


def prepare(weight: torch.Tensor, scale: torch.Tensor, dtype, block: tuple | None = None, act: str | None = "token",
            shard_sizes: list[int] | None = None, layout: str | None = None) -> FP8Weight:
    """Hold a layer's e4m3 weight [N, K] and its scales (per tensor: one, or one per merged
    shard expanded to rows; per channel [N]; per block [rows, cdiv(K, bk)] with block
    (bn, bk)) for its device, in `layout` (default_layout unless given). act: the scheme's
    activation quantization ("token", "group": per token and group of bk, None). Call once
    at load time, outside graph capture: on CUDA it also reserves the split-K workspace."""
    N, K = weight.shape
    shard_sizes = list(shard_sizes or [N])
    layout = layout or default_layout(weight.device, K, N, act, block)
    w = FP8Weight(layout, K, N, act, block[1] if act == "group" else 0)
    if layout == HOST:
        w.dense = _host_dense(weight, scale, block, shard_sizes, dtype)
    elif layout == BLOCK:
        w.weight = weight.contiguous()
        w.scale, w.block = _block_scales(scale, block, shard_sizes)
    elif layout in (SCALED, CHANNEL):
        w.weight = weight.contiguous()
        w.scale = scale.float().reshape(-1).expand(N).contiguous()
    else:
        raise ValueError(f"fp8 prepare: unknown layout {layout!r}")
    if weight.is_cuda:
        workspace(weight.device)
    return w


def dequantize(w: FP8Weight, dtype) -> torch.Tensor:
    """The layer's dense [N, K] weight in dtype."""
    if w.layout == HOST:
        return w.dense.to(dtype)
    if w.weight.is_cuda or interpret_mode():
        return dequant.dequantize(w.weight, w.scale, w.block, dtype)
    return dequantize_fp8(w.weight, w.scale, w.block, torch.float32).to(dtype)


def wants_quantized_input(w: FP8Weight, x: torch.Tensor) -> bool:
    """Called by the kernel producing the layer's next input (its token count and device
    those of x, any width): whether the layer's kernel for that step takes the input quantized
    per token to e4m3 (W8A8, cuBLAS FP8), which the producer then computes in its own launch
    and passes to `linear` as xq. Marks the layer fed (FP8Weight.fed). Before the step's
    choice is tuned: whether any of its candidates would take it."""
    if w.layout != SCALED or w.act != "token" or x.dim() != 2:
        return False
    w.fed = True
    if (settled := w.wants.get(x.shape[0])) is not None:  # (eager steps ask every call)
        return settled
    x2 = x.new_empty(1).expand(x.shape[0], w.in_features)  # the layer's input shape and device; no data read
    names = _kernels(x2, w)
    if not any(n in A8_KERNELS for n in names):
        w.wants[x.shape[0]] = False
        return False
    if len(names) > 1 and chosen(TUNED_PATH, _path_key(x2, w)) is None:
        return True  # not tuned yet: the tuning times W8A8 on a handed-over quantization
    w.wants[x.shape[0]] = plan(x2, w)[0] in A8_KERNELS
    return w.wants[x.shape[0]]


def linear(x: torch.Tensor, w: FP8Weight, bias: torch.Tensor | None = None,
           xq: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) -> [..., N] in x's dtype. xq: x [M, K] quantized per token
    (e4m3 [M, K], float32 scales [M, 1]) by the kernel that produced x (wants_quantized_input),
    taken by a W8A8 step in place of quantizing x again."""
    lead, K = x.shape[:-1], x.shape[-1]
    if K != w.in_features:
        raise ValueError(f"fp8 linear: x has K={K}, the layer {w.in_features}")
    x2 = x.reshape(-1, K)
    if xq is not None and xq[0].shape != x2.shape:
        raise ValueError(f"fp8 linear: xq holds {tuple(xq[0].shape)} values, x {tuple(x2.shape)}")
    names = _kernels(x2, w)
    if names == ("dense",):
        return _host(x, w, bias)
    if names == ("reference",):
        y = quantize_activations(x2, w.act, w.group).float() @ dequantize(w, torch.float32).t()
        y = (y if bias is None else y + bias.float()).to(x.dtype)
    else:
        y = _tuned(x2, w, names, bias, xq)
    return y.reshape(*lead, w.out_features)


def _kernels(x2: torch.Tensor, w: FP8Weight) -> tuple[str, ...]:
    """The step's candidates (llm_kernels.fp8.select); a block-scale layer takes the W8A8
    kernel only where its scheme quantizes activations per token and scale block (quantizing
    those of a weight-only scheme would change its product)."""
    names = candidates(device_class(x2), x2.dtype, x2.shape[0], w.layout)
    if w.layout == BLOCK and not (w.act == "group" and w.block and w.group == w.block[1]):
        names = tuple(n for n in names if n != "w8a8")
    return names


def _host(x: torch.Tensor, w: FP8Weight, bias) -> torch.Tensor:
    """The CPU's path, as it always was: per-token quantized activations with torch's linear,
    grouped ones (or none) with llm_kernels.dense."""
    if w.act == "token":
        lead, K = x.shape[:-1], x.shape[-1]
        xq = quantize_activations(x.reshape(-1, K), "token")
        return F.linear(xq, w.dense.to(x.dtype), bias).reshape(*lead, w.out_features)
    if w.act == "group":
        lead, K = x.shape[:-1], x.shape[-1]
        x = quantize_activations(x.reshape(-1, K), "group", w.group).reshape(*lead, K)
    return dense_linear(x, w.dense, bias)


def _scaled_mm(x2: torch.Tensor, w: FP8Weight, bias, xq=None) -> torch.Tensor:
    q, s = quantize_per_token(x2) if xq is None else xq
    return torch._scaled_mm(q, w.weight.t(), scale_a=s, scale_b=w.scale.view(1, -1), bias=bias,
                            out_dtype=x2.dtype)


def _run(x2: torch.Tensor, w: FP8Weight, cfg: dict, bias, xq=None) -> torch.Tensor:
    """One step on one config: the W8A16 or W8A8 kernel, torch._scaled_mm, or the dequantized
    weight; xq: x2 already quantized per token, for the W8A8 kinds."""
    if cfg["kind"] in ("w8a16", "w8a8"):
        return w8a16.launch(x2, w.weight, w.scale, w.block, cfg, bias, xq=xq if cfg["kind"] == "w8a8" else None)
    if cfg["kind"] == "scaled_mm":
        return _scaled_mm(x2, w, bias, xq)
    return F.linear(quantize_activations(x2, w.act, w.group), dequantize(w, x2.dtype), bias)


def plan(x2: torch.Tensor, w: FP8Weight) -> tuple[str, dict | None]:
    """(the kernel the layer runs for x2's shape, its config), as tuned so far (a Triton
    kernel's config None before its first call)."""
    M, K = x2.shape
    names = _kernels(x2, w)
    key = shape_key(M, w.out_features, K, w.layout, x2.dtype)
    name = names[0]
    if len(names) > 1 and (picked := chosen(TUNED_PATH, _path_key(x2, w))) is not None:
        name = KIND_TO_KERNEL[picked["kind"]]
    tuned = {"w8a16": TUNED_KERNEL, "w8a8": TUNED_A8}.get(name)
    return name, (chosen(tuned, key) if tuned else None)


def _path_key(x2: torch.Tensor, w: FP8Weight) -> tuple:
    """The choice between kernels is tuned per shape, and apart for a fed layer (FP8Weight.fed)."""
    key = shape_key(x2.shape[0], w.out_features, x2.shape[1], w.layout, x2.dtype)
    return key + ("fed",) if w.fed else key


def _kernel_config(x2: torch.Tensor, w: FP8Weight, bias, key: tuple, a8: bool = False, xq=None) -> dict:
    """The W8A16 (or W8A8) kernel's config for this shape: its candidates timed once (checked against the first)."""
    bk = w.block[1] if w.block else 0
    configs = (lambda: w8a8_configs(x2.shape[0], x2.device, bk)) if a8 else \
        (lambda: w8a16_configs(x2.shape[0], x2.dtype, x2.device, bk))
    return autotune(TUNED_A8 if a8 else TUNED_KERNEL, key, configs, lambda c: _run(x2, w, c, bias, xq),
                    checked=(x2.dtype, w.layout), cold_l2_device=x2.device if x2.is_cuda else None)


def w8a16_tuned(x2: torch.Tensor, w: FP8Weight, bias: torch.Tensor | None = None, a8: bool = False) -> torch.Tensor:
    """x2 [M, K] @ W^T (+ bias) on the W8A16 kernel (a8: the W8A8 one) alone with its tuned
    config, whatever the selection would run (benchmarks compare it with the others)."""
    key = shape_key(x2.shape[0], w.out_features, x2.shape[1], w.layout, x2.dtype)
    return _run(x2, w, _kernel_config(x2, w, bias, key, a8), bias)


def _tuned(x2: torch.Tensor, w: FP8Weight, names: tuple[str, ...], bias, xq=None) -> torch.Tensor:
    """The GPU layouts: each Triton kernel on its tuned config; where several kernels can run
    the step, the fastest, timed once per shape (without the agreement check, which the
    products' different activation rounding would fail). A fed layer's W8A8 kinds are timed
    on x2 quantized beforehand, as its producer then hands it over (xq)."""
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, K = x2.shape
    if M == 0:
        return x2.new_empty(0, w.out_features)
    key = shape_key(M, w.out_features, K, w.layout, x2.dtype)
    path_key = _path_key(x2, w)
    timed_xq = xq
    if timed_xq is None and w.fed and len(names) > 1 and chosen(TUNED_PATH, path_key) is None \
            and any(n in A8_KERNELS for n in names) and not (x2.is_cuda and torch.cuda.is_current_stream_capturing()):
        timed_xq = quantize_per_token(x2)  # for the timings only: outside them, as in the fed model
    path = [_kernel_config(x2, w, bias, key, a8=name == "w8a8", xq=timed_xq) if name in ("w8a16", "w8a8")
            else SCALED_MM if name == "scaled_mm" else DENSE for name in names]
    cfg = path[0] if len(path) == 1 else autotune(TUNED_PATH, path_key, path, lambda c: _run(x2, w, c, bias, timed_xq),
                                                  cold_l2_device=x2.device if x2.is_cuda else None)
    return _run(x2, w, cfg, bias, xq)
