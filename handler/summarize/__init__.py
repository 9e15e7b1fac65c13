"""The `summarize` batch client (`cli`, run as `summarize` or `python -m handler.summarize`)
and the map-reduce the worker's `summarize` job shares with it (`core`, `job`)."""
