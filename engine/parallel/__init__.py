"""Tensor parallelism within one worker: one process per rank (rank 0 is the engine's),
the step's inputs sent from rank 0 to the others; the split layers are engine.model.layers'."""
