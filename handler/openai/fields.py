"""OpenAI request fields this worker neither implements nor needs: the documented few that
are safe to ignore (they change nothing in the output), and the refusal of every other one,
naming it."""
from __future__ import annotations

from handler.errors import JobError, invalid
from handler.logs import clean

# accepted and ignored: labels, storage and routing hints that change no token of the output
SAFE_TO_IGNORE = frozenset({
    "model", "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
    "request_id",  # vLLM's: a label for its logs (the job's own id is ours)
})


def unsupported_field(prefix: str, key: str) -> JobError:
    """invalid_input naming a request field this worker does not implement."""
    return invalid(prefix + clean(key, 100), "is not supported by this worker (fields it may ignore: "
                   + ", ".join(sorted(SAFE_TO_IGNORE)) + ")")
