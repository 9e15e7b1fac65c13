"""Tokenizer loading (transformers' AutoTokenizer, no remote code); prompt
rendering is the input processor's, decoding the detokenizer's."""
from __future__ import annotations

from engine.errors import ModelLoadError


def load_tokenizer(path: str, revision: str | None = None):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - reported with its cause
        raise ModelLoadError(f"tokenizer at {path!r} could not be loaded: {exc}") from exc
