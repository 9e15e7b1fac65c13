"""Speculative decoding: drafts of a few tokens per request (prompt lookup: `ngram`),
verified in one forward of the target model inside the normal scheduler step.
config.py reads vLLM's speculative_config; ngram.py proposes; verify.py lays out a
verify step's sampler rows and takes the accepted run; speculator.py is the engine's
per-step policy (who speculates, the batch-size switch, acceptance counters)."""
from engine.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
