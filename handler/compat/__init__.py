"""Compatibility with worker-vllm: its environment variables, as a drop-in replacement."""
