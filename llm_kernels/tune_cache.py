"""The tuner's choices kept on disk, so that a process starting where an earlier one
tuned (a RunPod worker on the same network volume, the same machine again) takes
them instead of compiling and timing every candidate again: a cold start of a 7B
AWQ model spent minutes in the tuner.

One JSON file a GPU model and software: its name carries a hash of the identity
(GPU name, compute capability, SM count, torch, CUDA, Triton, and the source of
this package), so a choice is never taken by another GPU, another compiler or
other kernels. A stored choice is used only when it is still one of the
candidates the caller offers; anything unreadable is ignored with a warning and
replaced at the next save. Writes go to a temporary file renamed over the old
one, merged with what other processes saved meanwhile.

The directory: LLM_KERNELS_CACHE_DIR (empty: off), else $XDG_CACHE_HOME or
~/.cache, then llm_kernels. The worker points it under BASE_PATH.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import re
import tempfile
import time

import torch

log = logging.getLogger(__name__)

FORMAT = 1
SAVE_EVERY_S = 5.0  # new choices reach the disk at most this long after they were made (and at exit)

_store = None  # the active Store (activate); None: choices live in this process only


def default_dir() -> str | None:
    """Where the cache lives unless told otherwise; None when LLM_KERNELS_CACHE_DIR is empty."""
    env = os.environ.get("LLM_KERNELS_CACHE_DIR")
    if env is not None:
        return env.strip() or None
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "llm_kernels")


def source_hash() -> str:
    """sha256 of this package's Python sources, subpackages included: a kernel or candidate
    list edited is a new cache."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(here):
        dirs.sort()  # a fixed walk order
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            h.update(os.path.relpath(path, here).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def identity(device) -> dict:
    """What a tuned choice depends on besides its key."""
    import triton

    device = torch.device(device)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    return {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "kernels": source_hash()}


def encode(value):
    """A JSON value standing for a key or a config: tuples as lists, dtypes by name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in sorted(value.items())}
    return repr(value)


def key_text(full: tuple) -> str:
    return json.dumps(encode(full), separators=(",", ":"))


class Store:
    """The choices of one identity, in memory and in one file."""

    def __init__(self, path: str, ident: dict):
        self.path, self.identity = path, ident
        self.entries: dict[str, object] = {}  # key_text -> encoded config
        self.dirty = False
        self.writable = True
        self.last_save = time.monotonic()
        self.entries.update(self._read())

    def _read(self) -> dict:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("tuning cache %s unreadable, ignored: %s", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("identity") != self.identity \
                or not isinstance(data.get("entries"), dict):
            log.warning("tuning cache %s is of another format or identity, ignored", self.path)
            return {}
        return data["entries"]

    def lookup(self, full: tuple, configs: list):
        """The stored choice for full when it is still among configs, else None."""
        stored = self.entries.get(key_text(full))
        if stored is None:
            return None
        return next((c for c in configs if encode(c) == stored), None)

    def record(self, full: tuple, config) -> None:
        self.entries[key_text(full)] = encode(config)
        self.dirty = True
        if time.monotonic() - self.last_save >= SAVE_EVERY_S:
            self.save()

    def save(self) -> None:
        """Write the file (merged with the disk's entries, ours winning) if anything is new."""
        if not self.dirty or not self.writable:
            return
        self.last_save = time.monotonic()
        merged = {**self._read(), **self.entries}
        data = {"format": FORMAT, "identity": self.identity, "entries": merged}
        folder = os.path.dirname(self.path)
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tuned-", suffix=".json")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=0, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            self.writable = False
            log.warning("tuning cache %s cannot be written, choices stay in this process: %s", self.path, exc)
            return
        self.entries = merged
        self.dirty = False


def activate(directory: str | None, device) -> str | None:
    """Use the cache under directory for the tuner's choices on device (a CUDA device); None: off.
    Returns the file's path. Choices made before activation stay in the process only."""
    global _store
    if directory is None:
        _store = None
        return None
    ident = identity(device)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9]+", "_", ident["gpu"]).strip("_") or "gpu"
    path = os.path.join(os.path.abspath(os.path.expanduser(directory)), f"tuned-{slug}-{digest}.json")
    if _store is not None and _store.path == path:
        return path
    if _store is not None:
        _store.save()
    _store = Store(path, ident)
    log.info("tuning cache %s: %d stored choices", path, len(_store.entries))
    return path


def active() -> Store | None:
    """The Store in use (activate), or None."""
    return _store


def lookup(full: tuple, configs: list):
    return None if _store is None else _store.lookup(full, configs)


def record(full: tuple, config) -> None:
    if _store is not None:
        _store.record(full, config)


def save() -> None:
    if _store is not None:
        _store.save()


atexit.register(save)
