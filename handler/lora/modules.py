"""LORA_MODULES read into the adapters the worker serves, in worker-vllm's and vLLM's forms: a
JSON list of `{"name", "path", "base_model_name"?}` objects (or one such object, worker-vllm's
first form), or `name=path` entries separated by spaces or commas (vLLM's `--lora-modules
name=path ...`). Each adapter gets a stable lora_int_id, 1, 2, ... in the order written (the
engine's key for it). Every refusal is a SettingsError naming LORA_MODULES, with a `reason`."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from handler.logs import has_control_chars
from handler.setting_error import SettingsError

NAME = "LORA_MODULES"
KEYS = ("name", "path", "base_model_name")
MAX_NAME_CHARS = 256
MAX_ADAPTERS = 4096  # the engine's most max_cpu_loras: more could never be served


@dataclass(frozen=True, slots=True)
class LoRAModule:
    """One adapter of LORA_MODULES: the name jobs pick it by, its path as written (a folder or a
    hub id), its lora_int_id, and the base model it was trained on when given (listed as its
    parent by /v1/models)."""

    name: str
    path: str
    lora_int_id: int
    base_model_name: str | None = None


def _error(raw: str, reason: str, problem: str) -> SettingsError:
    return SettingsError(NAME, raw, problem, reason=reason)


def _json_entries(raw: str) -> list[tuple[str, Any]]:
    """(where, entry) of each entry of the JSON form."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _error(raw, "bad_json", f"not valid JSON ({exc.msg} at character {exc.pos}); expected a list of "
                     '{"name": ..., "path": ...} objects, or name=path entries') from None
    if isinstance(value, dict):  # worker-vllm's first form: one adapter
        return [("the adapter", value)]
    if not isinstance(value, list):
        raise _error(raw, "bad_entry", 'expected a JSON list of {"name": ..., "path": ...} objects')
    return [(f"entry {i}", v) for i, v in enumerate(value)]


def _from_object(raw: str, where: str, entry: Any) -> tuple[Any, Any, Any]:
    if not isinstance(entry, dict):
        raise _error(raw, "bad_entry", f'{where} is not an object {{"name": ..., "path": ...}}')
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise _error(raw, "unknown_key", f"{where} has the unknown key {unknown[0]!r} (keys: {', '.join(KEYS)})")
    if entry.get("name") in (None, ""):
        raise _error(raw, "missing_name", f'{where} has no "name"')
    if entry.get("path") in (None, ""):
        raise _error(raw, "missing_path", f"{where} ({entry['name']!r}) has no \"path\"")
    return entry["name"], entry["path"], entry.get("base_model_name")


def _from_pair(raw: str, word: str) -> tuple[str, str, None]:
    name, eq, path = word.partition("=")
    if not eq:
        raise _error(raw, "bad_entry", f"{word!r} is not name=path (or use the JSON form)")
    if not name:
        raise _error(raw, "missing_name", f"{word!r} has no name before '='")
    if not path:
        raise _error(raw, "missing_path", f"{name!r} has no path after '='")
    return name, path, None


def _check_text(raw: str, where: str, key: str, value: Any, reason: str) -> None:
    if not isinstance(value, str) or not value.strip() or value != value.strip() or has_control_chars(value):
        raise _error(raw, reason, f"{where}: {key} must be a non-empty string without surrounding spaces or "
                     f"control characters, got {value!r}")


def parse_lora_modules(name: str, raw: str) -> tuple[LoRAModule, ...]:
    """The adapters of LORA_MODULES' value (Setting.convert: `name` is the variable's); `[]` or
    nothing: none. Raises SettingsError naming LORA_MODULES with a reason: bad_json, bad_entry,
    unknown_key, missing_name, missing_path, bad_name, bad_path, duplicate_name, too_many."""
    text = raw.strip()
    if text.startswith(("[", "{", "\"")):  # JSON (a quoted string too: refused as not a list)
        entries = [(where,) + _from_object(raw, where, e) for where, e in _json_entries(text)]
    else:
        entries = [(repr(w),) + _from_pair(raw, w) for w in re.split(r"[\s,]+", text) if w]
    if len(entries) > MAX_ADAPTERS:
        raise _error(raw, "too_many", f"{len(entries)} adapters; at most {MAX_ADAPTERS}")
    modules: list[LoRAModule] = []
    for where, adapter, path, base in entries:
        _check_text(raw, where, "name", adapter, "bad_name")
        if len(adapter) > MAX_NAME_CHARS:
            raise _error(raw, "bad_name", f"{where}: the name is longer than {MAX_NAME_CHARS} characters")
        _check_text(raw, where, "path", path, "bad_path")
        if base is not None:
            _check_text(raw, where, "base_model_name", base, "bad_entry")
        if any(m.name == adapter for m in modules):
            raise _error(raw, "duplicate_name", f"the name {adapter!r} is given twice: each adapter needs its own")
        modules.append(LoRAModule(adapter, path, len(modules) + 1, base))
    return tuple(modules)


def lora_enabled(settings: Any) -> bool:
    """ENABLE_LORA, or (unset) whether LORA_MODULES names adapters."""
    enabled = getattr(settings, "enable_lora", None)
    return bool(getattr(settings, "lora_modules", None)) if enabled is None else enabled


def check_lora_settings(settings: Any, base_names: set[str]) -> None:
    """What no single variable's parse can see: LORA_MODULES with ENABLE_LORA=false, and an
    adapter named like the base model (`base_names`: the names jobs pick it by). SettingsError."""
    modules = getattr(settings, "lora_modules", None) or ()
    if modules and settings.enable_lora is False:
        names = ", ".join(m.name for m in modules)
        raise SettingsError("ENABLE_LORA", "false", f"LORA_MODULES names adapters ({names}) but ENABLE_LORA is "
                            "false: set ENABLE_LORA=true (or leave it unset), or unset LORA_MODULES", reason="conflict")
    for m in modules:
        if m.name in base_names:
            raise SettingsError(NAME, m.name, f"the adapter name {m.name!r} is the base model's served name: "
                                "give the adapter another name", reason="duplicate_name")
