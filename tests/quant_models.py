"""Quantized tiny checkpoints for the format tests: compressed-tensors ones made by
llm-compressor itself (in .venv-llmc, scripts/llmc_venv.sh: it pins its own
transformers), GPTQ and FP8 ones packed here by the formats' published layouts from
known integers, each with a dense reference checkpoint of exactly the weights meant."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from llm_kernels.w4a16.gptq_format import pack_cols, pack_rows
from tests import models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLMC_VENV = os.environ.get("LLMC_VENV", os.path.join(ROOT, ".venv-llmc"))


def ct_pack(q_unsigned: torch.Tensor, bits: int) -> torch.Tensor:
    """int [N, K] of 0..2^bits-1 -> compressed-tensors' weight_packed int32 [N, K*bits/32]."""
    return pack_rows(q_unsigned.t(), bits).t().contiguous()


def llmc_python() -> str | None:
    """.venv-llmc's python, made by scripts/llmc_venv.sh when missing (None: it could not be)."""
    env = {**os.environ, "LLMC_VENV": LLMC_VENV}
    done = subprocess.run(["bash", os.path.join(ROOT, "scripts", "llmc_venv.sh")], env=env, capture_output=True, text=True)
    py = os.path.join(LLMC_VENV, "bin", "python")
    return py if done.returncode == 0 and os.path.exists(py) else None


def llmc_quantize(src: str, jobs: dict[str, str]) -> None:
    """jobs: destination folder -> "SCHEME[:GROUP]", made by llm-compressor's oneshot."""
    todo = [f"{dst}:{spec}" for dst, spec in jobs.items() if not os.path.exists(os.path.join(dst, "config.json"))]
    if not todo:
        return
    py = llmc_python()
    if py is None:
        raise RuntimeError("scripts/llmc_venv.sh could not make .venv-llmc")
    subprocess.run([py, os.path.join(ROOT, "tests", "llmc_produce.py"), src, *todo], check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": ""})


def _linears(sd: dict):
    return [n for n in sd if ".layers." in n and n.endswith("proj.weight")]


def _save(dst: str, src: str, tensors: dict, quantization_config: dict | None) -> str:
    from safetensors.torch import save_file

    os.makedirs(dst, exist_ok=True)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    models.make_tokenizer().save_pretrained(dst)
    return dst


def _group_index(K: int, group: int, desc_act: bool, gen) -> torch.Tensor:
    """GPTQ's g_idx: rows in act-order (a random permutation here) get groups i // group."""
    g = group if group > 0 else K
    if not desc_act:
        return torch.arange(K) // g
    perm = torch.randperm(K, generator=gen)
    g_idx = torch.empty(K, dtype=torch.long)
    g_idx[perm] = torch.arange(K) // g
    return g_idx


def _quantize_rows(w: torch.Tensor, g_idx: torch.Tensor, bits: int, sym: bool, min_zero: int):
    """Round-to-nearest of w [K, N] per group of rows: (q [K, N], z [G, N], s [G, N] fp16)."""
    maxq, G = (1 << bits) - 1, int(g_idx.max()) + 1
    q, zs, ss = torch.empty(w.shape, dtype=torch.int32), [], []
    for j in range(G):
        rows = w[g_idx == j]
        if sym:
            s = (2 * rows.abs().amax(0) / maxq).clamp_min(1e-6)
            z = torch.full_like(s, (maxq + 1) // 2)
        else:
            lo, hi = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
            s = ((hi - lo) / maxq).clamp_min(1e-6)
            z = (-lo / s).round().clamp(min_zero, maxq)
        s = s.half()
        q[g_idx == j] = (rows / s.float() + z).round().clamp(0, maxq).to(torch.int32)
        zs.append(z.to(torch.int32))
        ss.append(s)
    return q, torch.stack(zs), torch.stack(ss)


def gptq_checkpoint(src: str, dst: str, bits: int = 4, group: int = 128, sym: bool = True, desc_act: bool = False,
                    checkpoint_format: str = "gptq", shared_order: bool = True, seed: int = 0) -> tuple[str, str]:
    """A GPTQ checkpoint of src (qweight/qzeros/scales/g_idx, AutoGPTQ's packing;
    "gptq" v1 stores zeros minus one) and its dense reference: (dst, dst + "-ref").
    Act-order: one random order per input (q/k/v share theirs, as GPTQ's Hessian
    order does) or, shared_order False, one per projection."""
    from safetensors.torch import load_file

    ref = dst + "-ref"
    if os.path.exists(os.path.join(ref, "config.json")):
        return dst, ref
    gen = torch.Generator().manual_seed(seed)
    sd = load_file(os.path.join(src, "model.safetensors"))
    out, dense, orders = {}, dict(sd), {}
    v1 = checkpoint_format == "gptq"
    for name in _linears(sd):
        w = sd[name].t().float()  # [K, N]
        key = (name.rsplit(".", 2)[0], name.rsplit(".", 2)[1] in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
        if key not in orders or not shared_order:
            orders[key] = _group_index(w.shape[0], group, desc_act, gen)
        g_idx = orders[key]
        q, z, s = _quantize_rows(w, g_idx, bits, sym, 1 if v1 else 0)
        base = name[: -len(".weight")]
        out[base + ".qweight"] = pack_rows(q, bits)
        out[base + ".qzeros"] = pack_cols(z - (1 if v1 else 0), bits)
        out[base + ".scales"] = s
        out[base + ".g_idx"] = g_idx.to(torch.int32)
        dense[name] = ((q - z[g_idx]).float() * s.float()[g_idx]).t().contiguous()
    out.update({n: t for n, t in sd.items() if n not in _linears(sd)})
    qc = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act, "sym": sym,
          "checkpoint_format": checkpoint_format, "static_groups": False, "true_sequential": True}
    _save(dst, src, out, qc)
    _save(ref, src, dense, None)
    return dst, ref


def ct_decompressed_reference(ct_dir: str, src: str) -> str:
    """A dense checkpoint of the weights compressed-tensors' own decompressor reads from a
    pack-quantized folder (for schemes transformers cannot load itself)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file

    ref = ct_dir + "-ref"
    if os.path.exists(os.path.join(ref, "config.json")):
        return ref
    qc = json.load(open(os.path.join(ct_dir, "config.json")))["quantization_config"]
    group = next(iter(qc["config_groups"].values()))
    scheme = QuantizationScheme(targets=group["targets"], weights=group["weights"])
    compressor = BaseCompressor.load_from_registry(group.get("format") or qc["format"])
    sd, dense = load_file(os.path.join(ct_dir, "model.safetensors")), {}
    for base in {n[: -len(".weight_packed")] for n in sd if n.endswith(".weight_packed")}:
        local = {n[len(base) + 1 :]: t for n, t in sd.items() if n.startswith(base + ".")}
        dense[base + ".weight"] = compressor.decompress(local, scheme)["weight"].float()
    dense.update({n: t for n, t in sd.items() if ".weight_" not in n})
    return _save(ref, src, dense, None)


def fp8_block_checkpoint(src: str, dst: str, block: tuple[int, int] | None = (128, 128)) -> tuple[str, str]:
    """A quant_method "fp8" checkpoint (e4m3 weights, weight_scale_inv per block, the
    official Qwen3-FP8 layout; block None: one weight_scale a tensor, activations then
    quantized per token) and its dense reference (the dequantized weights)."""
    from safetensors.torch import load_file

    ref = dst + "-ref"
    if os.path.exists(os.path.join(ref, "config.json")):
        return dst, ref
    sd = load_file(os.path.join(src, "model.safetensors"))
    out, dense = dict(sd), dict(sd)
    for name in _linears(sd):
        w = sd[name].float()
        N, K = w.shape
        if block is None:
            scale = (w.abs().amax() / 448).clamp_min(1e-8).reshape(1)
            q = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            out[name], out[name[: -len("weight")] + "weight_scale"] = q, scale
            dense[name] = q.float() * scale
            continue
        bn, bk = block
        pad = torch.zeros(-(-N // bn) * bn, -(-K // bk) * bk)
        pad[:N, :K] = w
        blocks = pad.reshape(pad.shape[0] // bn, bn, pad.shape[1] // bk, bk)
        scale = (blocks.abs().amax((1, 3)) / 448).clamp_min(1e-8)
        s_full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:N, :K]
        q = (w / s_full).clamp(-448, 448).to(torch.float8_e4m3fn)
        out[name], out[name[: -len("weight")] + "weight_scale_inv"] = q, scale
        dense[name] = q.float() * s_full
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3"}
    if block is not None:
        qc["weight_block_size"] = list(block)
    _save(dst, src, out, qc)
    _save(ref, src, dense, None)
    return dst, ref


if __name__ == "__main__":  # python -m tests.quant_models SRC DST...: GPTQ defaults, for a look by hand
    print(gptq_checkpoint(sys.argv[1], sys.argv[2]))
