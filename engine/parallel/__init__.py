"""Tensor parallelism within one worker: one process per rank (rank 0 is the
engine's), linears and attention heads split across ranks (engine/model/layers.py),
the step's inputs sent from rank 0 to the others (launcher.py, step.py, worker.py)."""
from engine.parallel.group import SINGLE, TPGroup

__all__ = ["SINGLE", "TPGroup"]
