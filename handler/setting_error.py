"""The error of a bad environment variable (handler.settings re-exports it): its own module so
that the modules reading worker-vllm's variables, which load_settings calls, can raise it
without importing the settings table back."""
from __future__ import annotations


class SettingsError(ValueError):
    """A bad environment variable; the message starts with the variable's name. `reason`: a
    stable code of what is wrong, where a setting has several ways to be wrong worth telling
    apart (LORA_MODULES: bad_json, missing_path, duplicate_name, ...)."""

    def __init__(self, name: str, raw: str, problem: str, reason: str | None = None):
        super().__init__(f"{name}={raw!r}: {problem}")
        self.name = name
        self.reason = reason
