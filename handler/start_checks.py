"""Checks at start that no single setting's parse can make: CUSTOM_CHAT_TEMPLATE renders a
probe conversation (a broken template would fail every chat job `invalid_input`, blaming the
client's messages, while the worker never said its setting was wrong)."""
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
