"""What a job yields, per route: the native items (worker-vllm's), the OpenAI
objects and stream chunks; the summarize job's are in handler.summarize.job."""
