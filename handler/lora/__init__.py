"""LoRA adapters served by the worker (worker-vllm's ENABLE_LORA, LORA_MODULES, MAX_LORAS,
MAX_LORA_RANK, MAX_CPU_LORAS): the adapters LORA_MODULES names (modules), where each one's
folder is (paths), loaded and checked at start (served), and which one a job runs with (select)."""
