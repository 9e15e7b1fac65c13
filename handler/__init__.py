"""RunPod face of the worker: job schema, env settings, streaming, errors, concurrency, the
RunPod loop and the local HTTP endpoint, grouped by feature (job, native, openai, tools,
summarize). Importing it loads nothing heavy; `python -m handler` starts the worker."""

__all__: list[str] = []
