"""Structured output as the engine takes it (`structured_outputs`, engine.structured.params),
whatever form of the job gave it: `Structured` (the value and the job field it came from),
and vLLM's structured_outputs object (native sampling_params' structured_outputs or
guided_decoding, OpenAI's structured_outputs) checked into the engine's fields. The OpenAI
forms are handler.openai.structured's, a forced tool_choice's handler.tools.forced_schema's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handler.errors import invalid

# vLLM's backend names, accepted and ignored: the grammar engine here is always llguidance
BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")


@dataclass(slots=True)
class Structured:
    """One request's structured output: the engine's fields, the job field that gave them (as
    sent, without the openai_input. prefix) and the field an engine refusal of them names."""

    value: dict
    sent: str
    field: str


def check_backend(value: Any, where: str) -> None:
    if value is not None and value not in BACKENDS:
        raise invalid(where, "must be one of " + ", ".join(BACKENDS) + " (this worker always uses llguidance)")


def spec_object(value: Any, where: str) -> dict:
    """vLLM's structured_outputs (or guided_decoding) object as the engine's fields: `backend`
    checked and dropped, `disable_fallback` too (there is no other backend to fall back to)."""
    if not isinstance(value, dict):
        raise invalid(where, "must be an object with one of json, json_object, regex, choice, grammar")
    out = dict(value)
    check_backend(out.pop("backend", None), where + ".backend")
    fallback = out.pop("disable_fallback", None)
    if fallback is not None and not isinstance(fallback, bool):
        raise invalid(where + ".disable_fallback", "must be true or false")
    return out
