"""RunPod face of the worker: job schema, env settings, streaming, errors and
concurrency. Importing it loads nothing heavy; `python -m handler` starts the worker."""

__all__: list[str] = []
