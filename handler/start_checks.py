"""Checks at start that no single setting's parse can make: CUSTOM_CHAT_TEMPLATE renders a
probe conversation (a broken template would fail every chat job `invalid_input`, blaming the
client's messages, while the worker never said its setting was wrong), and a cached model's
snapshot holds the files it needs (else it fails naming MODEL_NAME and the folder, not a file
deep inside the load). A worker whose model cannot load at start exits as
handler.engine_setup.load_failure_exit says."""
from __future__ import annotations

from typing import Any

PROBE = [{"role": "user", "content": "Hello, what can you do?"}]


def check_chat_template(settings: Any) -> None:
    """Render CUSTOM_CHAT_TEMPLATE (when set) on a one-message conversation, with and without
    the generation prompt; raises SettingsError naming it when it cannot compile, raises, or
    leaves the message out."""
    from handler.logs import clean
    from handler.settings import SettingsError

    template = settings.custom_chat_template
    if template is None:
        return
    from transformers.utils.chat_template_utils import render_jinja_template

    shown = clean(template, 60)
    for generation in (True, False):
        try:
            rendered = render_jinja_template([PROBE], chat_template=template, add_generation_prompt=generation,
                                             bos_token="<s>", eos_token="</s>")
        except Exception as exc:  # noqa: BLE001 - any failure of the template is the setting's
            raise SettingsError("CUSTOM_CHAT_TEMPLATE", shown, "the template cannot render a one-message "
                                f"conversation: {type(exc).__name__}: {clean(exc)}") from None
        if PROBE[0]["content"] not in rendered[0][0]:  # (rendered conversations, generation indices)
            raise SettingsError("CUSTOM_CHAT_TEMPLATE", shown, "the template's output of a one-message "
                                "conversation does not hold the message's content")


def check_cached_snapshot(model_name: str, path: str) -> None:
    """A cached model's snapshot must hold config.json and every weight file its shard index
    names (a copy or download cut short leaves them out); raises ModelLoadError
    (model_load_failed) naming MODEL_NAME, the folder and what is missing, before any file of it
    is read."""
    import json
    import os

    from engine.errors import ModelLoadError

    missing = [] if os.path.isfile(os.path.join(path, "config.json")) else ["config.json"]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"MODEL_NAME={model_name}: the cached snapshot {path} has an unreadable "
                                 f"model.safetensors.index.json ({type(exc).__name__}: {exc})") from None
        missing += [s for s in shards if not os.path.isfile(os.path.join(path, s))]  # a broken link counts
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"MODEL_NAME={model_name}: the cached snapshot {path} is incomplete: "
                             f"{', '.join(missing[:5])}{more} missing")
