"""Batched LoRA: every token's low-rank update from its own adapter, in place on the base
layer's output (out[t] += (x[t] @ a[s].T) @ b[s].T, s = slots[t], -1 for none).

`add_lora` picks the path: the Triton shrink/expand kernels on CUDA tensors (and on CPU tensors
under TRITON_INTERPRET=1), the grouped PyTorch path (llm_kernels.lora.cpu) elsewhere.
`add_lora_reference` is the per-token float32 oracle of the tests."""
from llm_kernels.lora.apply import add_lora
from llm_kernels.lora.cpu import add_lora_cpu
from llm_kernels.lora.reference import add_lora_reference

__all__ = ["add_lora", "add_lora_cpu", "add_lora_reference"]
