"""LoRA adapters (vLLM's names): a request names one with a LoRARequest; the engine loads it
from PEFT's format into one of max_loras slots on the device and adds each token's low-rank
update beside the base linear (llm_kernels.lora.add_lora), so requests of different adapters
share a batch."""
