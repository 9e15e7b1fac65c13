"""AWQ 4-bit quantization of a Hugging Face checkpoint with AutoAWQ, safe on the CPU.

Run as `python -m handler.prepare.quantize SRC_DIR OUT_DIR [--group-size 64] ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from handler.prepare.awq_progress import import_awq, layer_progress

logger = logging.getLogger(__name__)

DEFAULT_CALIBRATION = Path(__file__).resolve().parent / "data" / "calibration.txt"
GROUP_SIZES = (32, 64, 128)
_CHAT_ROLES = {"User:": "user", "Assistant:": "assistant", "System:": "system"}


@dataclass(slots=True)
class QuantSettings:
    """How a checkpoint is quantized (defaults: the command line's; the default model sets its own)."""

    group_size: int = 64
    samples: int = 16
    seq_len: int = 256
    apply_clip: bool = False
    duo_scaling: bool = True
    calibration: Path = DEFAULT_CALIBRATION

    def awq_config(self) -> dict:
        return {"zero_point": True, "q_group_size": self.group_size, "w_bit": 4, "version": "GEMM"}


# --------------------------------------------------------------------------- #
# The CPU workaround for AutoAWQ 0.2.9
# --------------------------------------------------------------------------- #


@contextlib.contextmanager
def _state_dict_snapshots_copy(module) -> Iterator[None]:
    """Make `module.state_dict()` return real copies instead of views of the live tensors."""
    live_state_dict = module.state_dict

    def copied_state_dict(*args, **kwargs):
        return {k: v.detach().clone() for k, v in live_state_dict(*args, **kwargs).items()}

    module.state_dict = copied_state_dict  # instance attribute shadows the method
    try:
        yield
    finally:
        del module.state_dict


@contextlib.contextmanager
def awq_cpu_fix() -> Iterator[None]:
    """Patch AutoAWQ's scale search so that its weight snapshot is a copy, not an alias.

    `AwqQuantizer._compute_best_scale` saves the inspected module as
    `{k: v.cpu() for k, v in state_dict().items()}` and scales the weights in place
    while it searches. On a GPU `.cpu()` copies; on the CPU it returns the same
    tensors, so the "restore" brings back scaled weights and the checkpoint is wrong.
    Only active inside the `with` block; AutoAWQ itself is left untouched.
    """
    import_awq()
    from awq.quantize.quantizer import AwqQuantizer

    original = AwqQuantizer._compute_best_scale
    signature = inspect.signature(original)
    assert "module2inspect" in signature.parameters, "AutoAWQ changed; review awq_cpu_fix"

    @functools.wraps(original)
    def patched(self, *args, **kwargs):
        module = signature.bind(self, *args, **kwargs).arguments["module2inspect"]
        with _state_dict_snapshots_copy(module):
            return original(self, *args, **kwargs)

    AwqQuantizer._compute_best_scale = patched
    try:
        yield
    finally:
        AwqQuantizer._compute_best_scale = original


# --------------------------------------------------------------------------- #
# Calibration data
# --------------------------------------------------------------------------- #


def read_calibration_texts(path: str | os.PathLike) -> list[str]:
    """Calibration documents: a .jsonl of {"text": ...} lines, or plain text split at blank lines."""
    path = Path(path)
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        texts = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
    else:
        texts = [block.strip() for block in raw.replace("\r\n", "\n").split("\n\n")]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"calibration file {path} holds no text")
    return texts


def _as_chat(text: str) -> list[dict] | None:
    """A block written as 'User: ...' / 'Assistant: ...' turns, as chat messages; else None."""
    if not text.startswith("User:") and not text.startswith("System:"):
        return None
    messages: list[dict] = []
    for line in text.splitlines():
        role = next((r for prefix, r in _CHAT_ROLES.items() if line.startswith(prefix)), None)
        if role is not None:
            prefix = next(p for p in _CHAT_ROLES if line.startswith(p))
            messages.append({"role": role, "content": line[len(prefix):].strip()})
        else:
            messages[-1]["content"] += "\n" + line
    return messages


def _encode(tokenizer, text: str) -> list[int]:
    messages = _as_chat(text)
    if messages is not None and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        return list(ids)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        ids = ids + [tokenizer.eos_token_id]
    return ids


def calibration_blocks(tokenizer, texts: Sequence[str], samples: int, seq_len: int) -> list[list[int]]:
    """Token blocks of exactly `seq_len` ids, cut from the concatenated documents.

    Blocks are pre-tokenized so AutoAWQ's loader never drops a sample for being
    too long. With more text than needed, the blocks are spread evenly over it.
    """
    if samples < 1 or seq_len < 8:
        raise ValueError(f"need samples >= 1 and seq_len >= 8, got {samples} and {seq_len}")
    stream: list[int] = []
    for text in texts:
        stream.extend(_encode(tokenizer, text))
    available = len(stream) // seq_len
    if available == 0:
        raise ValueError(f"calibration text has {len(stream)} tokens, fewer than one block of {seq_len}")
    if available < samples:
        logger.warning("calibration text gives %d blocks of %d tokens, not %d; using %d",
                       available, seq_len, samples, available)
        samples = available
    stride = available / samples
    starts = [int(i * stride) * seq_len for i in range(samples)]
    return [stream[s:s + seq_len] for s in starts]


# --------------------------------------------------------------------------- #
# Quantization
# --------------------------------------------------------------------------- #


def _linear_dims(src: Path) -> dict:
    config = json.loads((src / "config.json").read_text())
    config = config.get("text_config", config)
    return {k: config[k] for k in ("hidden_size", "intermediate_size") if k in config}


def pick_group_size(src: str | os.PathLike) -> int:
    """The largest of 128, 64, 32 that divides the model's hidden and intermediate sizes."""
    dims = _linear_dims(Path(src))
    for size in sorted(GROUP_SIZES, reverse=True):
        if all(v % size == 0 for v in dims.values()):
            return size
    raise ValueError(f"no group size in {GROUP_SIZES} divides {dims}")


def _check_group_size(src: Path, group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group size must be one of {GROUP_SIZES}, got {group_size}")
    bad = {k: v for k, v in _linear_dims(src).items() if v % group_size}
    if bad:
        raise ValueError(f"group size {group_size} does not divide {bad}; try 64 or 32")


def quantize_checkpoint(src: str | os.PathLike, out: str | os.PathLike,
                        settings: QuantSettings | None = None,
                        progress: Callable[[str], None] | None = None) -> Path:
    """AWQ-quantize the checkpoint in `src` into `out` (AutoAWQ GEMM layout) and return `out`.

    The result is written to a temporary sibling folder and renamed into place,
    so `out` is either absent or complete. `out` must not exist yet.
    """
    settings = settings or QuantSettings()
    src, out = Path(src), Path(out)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} is not a Hugging Face checkpoint (no config.json)")
    if out.exists():
        raise FileExistsError(f"{out} already exists")
    _check_group_size(src, settings.group_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        quantize_into(src, tmp, settings, progress)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def quantize_into(src: Path, out: Path, settings: QuantSettings,
                  progress: Callable[[str], None] | None = None) -> None:
    """Quantize `src` and save the AutoAWQ checkpoint into `out` (no atomicity: callers rename).
    `progress` hears one line per quantized layer (default: the log)."""
    import torch
    from transformers import AutoTokenizer

    AutoAWQForCausalLM = import_awq().AutoAWQForCausalLM

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(src)
    blocks = calibration_blocks(tokenizer, read_calibration_texts(settings.calibration),
                                settings.samples, settings.seq_len)
    logger.info("AWQ: %s, group size %d, %d calibration blocks of %d tokens, clip search %s",
                src, settings.group_size, len(blocks), settings.seq_len,
                "on" if settings.apply_clip else "off")
    on_cpu = not torch.cuda.is_available()
    # fp16 matmuls are several times slower than fp32 on a CPU; the packed
    # weights and scales come out fp16 either way.
    dtype = torch.float32 if on_cpu else torch.float16
    model = AutoAWQForCausalLM.from_pretrained(
        str(src), **_dtype_argument(dtype), trust_remote_code=False, safetensors=True, device_map=None,
        use_cache=False)
    with awq_cpu_fix() if on_cpu else contextlib.nullcontext(), layer_progress(progress):
        model.quantize(tokenizer, quant_config=settings.awq_config(), calib_data=blocks,
                       max_calib_samples=len(blocks), max_calib_seq_len=settings.seq_len,
                       apply_clip=settings.apply_clip, duo_scaling=settings.duo_scaling)
    model.model.half()  # norms and embeddings; the packed layers already are
    model.save_quantized(str(out))
    tokenizer.save_pretrained(out)
    _tidy_saved(out)
    logger.info("AWQ: quantized in %.0f s", time.monotonic() - started)


def _dtype_argument(dtype) -> dict:
    """The load dtype for AutoAWQ's from_pretrained, which hands unknown keywords on to
    transformers: `dtype` where transformers knows it (4.56 on; `torch_dtype` is deprecated
    there), else `torch_dtype`."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def _tidy_saved(out: Path) -> None:
    """Inference-ready metadata (caching on, AutoAWQ's forced sampling flag gone), readable files."""
    path = out / "config.json"
    config = json.loads(path.read_text())
    config["use_cache"] = True
    config["dtype"] = "float16"
    path.write_text(json.dumps(config, indent=2) + "\n")
    gen_path = out / "generation_config.json"
    if gen_path.is_file():
        gen = json.loads(gen_path.read_text())
        gen.pop("do_sample", None)
        gen_path.write_text(json.dumps(gen, indent=2) + "\n")
    make_readable(out)


def make_readable(folder: Path) -> None:
    """Give a folder made by mkdtemp (0700) and its files the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for child in folder.rglob("*"):
        os.chmod(child, (0o777 if child.is_dir() else 0o666) & ~umask)


# --------------------------------------------------------------------------- #
# Dequantization (reference, to check a checkpoint with plain transformers)
# --------------------------------------------------------------------------- #

# Nibble shift of logical column j inside an int32 (AutoAWQ packs columns 0,2,4,6,1,3,5,7).
_AWQ_SHIFTS = (0, 16, 4, 20, 8, 24, 12, 28)


def unpack_awq_int4(packed):
    """int32 [R, C/8] packed along columns in AutoAWQ order -> int32 [R, C] values 0..15."""
    import torch

    shifts = torch.tensor(_AWQ_SHIFTS, dtype=torch.int32, device=packed.device)
    values = (packed.unsqueeze(-1) >> shifts) & 0xF
    return values.reshape(packed.shape[0], -1)


def dequantize_awq_linear(qweight, qzeros, scales, group_size: int):
    """AutoAWQ GEMM tensors -> float weight [out_features, in_features] as nn.Linear holds it."""
    q = unpack_awq_int4(qweight)                                   # [K, N]
    z = unpack_awq_int4(qzeros).repeat_interleave(group_size, 0)    # [K, N]
    s = scales.float().repeat_interleave(group_size, 0)            # [K, N]
    return ((q - z).float() * s).t().contiguous()


def dequantized_state_dict(folder: str | os.PathLike) -> dict:
    """The float (fp32) state dict of an AutoAWQ GEMM checkpoint, for LlamaForCausalLM & co."""
    import torch
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") != "awq" or qc.get("bits", 4) != 4:
        raise ValueError(f"{folder} is not a 4-bit AWQ checkpoint: {qc}")
    raw: dict = {}
    for file in sorted(folder.glob("*.safetensors")):
        raw.update(load_file(file))
    state = {}
    for name, tensor in raw.items():
        if name.endswith(".qweight"):
            base = name[: -len(".qweight")]
            state[base + ".weight"] = dequantize_awq_linear(
                tensor, raw[base + ".qzeros"], raw[base + ".scales"], qc["group_size"])
        elif not name.endswith((".qzeros", ".scales")):
            state[name] = tensor.to(torch.float32) if tensor.is_floating_point() else tensor
    return state


def load_dequantized_model(folder: str | os.PathLike):
    """A transformers causal LM (fp32, CPU) holding the dequantized weights of an AWQ checkpoint."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(dequantized_state_dict(folder), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ValueError(f"{folder}: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}")
    model.tie_weights()
    return model.eval()


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #


def main(argv: Sequence[str] | None = None) -> int:
    defaults = QuantSettings()
    parser = argparse.ArgumentParser(
        prog="python -m handler.prepare.quantize",
        description="AWQ 4-bit quantize a Hugging Face checkpoint (AutoAWQ GEMM layout).")
    parser.add_argument("src", type=Path, help="folder with config.json, safetensors weights, tokenizer")
    parser.add_argument("out", type=Path, help="output folder (must not exist)")
    parser.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=None,
                        help="weights per scale (default: the largest of 128, 64, 32 that fits the model)")
    parser.add_argument("--calib", type=Path, default=defaults.calibration,
                        help="calibration text: plain text (blocks split at blank lines) or .jsonl with 'text'")
    parser.add_argument("--samples", type=int, default=defaults.samples, help="calibration blocks")
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len, help="tokens per calibration block")
    parser.add_argument("--clip", action="store_true", help="also run AutoAWQ's clip search (slow on CPU)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if not (args.src / "config.json").is_file():
            raise FileNotFoundError(f"{args.src} is not a Hugging Face checkpoint (no config.json)")
        group_size = args.group_size or pick_group_size(args.src)
        settings = QuantSettings(group_size=group_size, samples=args.samples, seq_len=args.seq_len,
                                 apply_clip=args.clip, calibration=args.calib)
        out = quantize_checkpoint(args.src, args.out, settings)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        parser.error(str(exc))
    logger.info("done: %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
