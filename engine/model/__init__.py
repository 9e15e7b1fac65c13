"""Models: the architecture registry (registry.py), one file per family, their
building blocks (layers/), and the generic checkpoint loader (loader.py)."""
