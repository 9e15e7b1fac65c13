"""LoRARequest: which adapter a request runs with (vLLM's class and argument order)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidInputError
from engine.validation import is_int


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """lora_name: the name it is served by; lora_int_id: a positive id, one per adapter (the
    engine's key: the same id must always name the same path); lora_path: a folder in PEFT's
    format (adapter_config.json and adapter_model.safetensors); base_model_name: the base it
    was trained on, when known (a mismatch with the served model is refused at load)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise InvalidInputError("lora_name must be a non-empty string", field="lora_request.lora_name")
        if not is_int(self.lora_int_id) or self.lora_int_id < 1:
            raise InvalidInputError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}",
                                    field="lora_request.lora_int_id")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise InvalidInputError("lora_path must be the adapter's folder", field="lora_request.lora_path")
