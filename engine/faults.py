"""Fault injection for tests (EngineConfig.fault_injection, off by default): out-of-memory
in a step, NaN/inf logits or a detokenizer exception for one request, a dead device, and
an I/O error while the weights load. Each step fault fires at the first step >= its
`<kind>_at_step` whose batch holds `<kind>_request_id` (no id: every request of that step)."""
from __future__ import annotations

import errno

from engine.errors import InvalidInputError
from engine.validation import is_int

STEP_KINDS = ("oom", "nan", "detokenize_error", "dead")
KEYS = ({f"{k}_at_step" for k in STEP_KINDS} | {f"{k}_request_id" for k in STEP_KINDS}
        | {"nan_value", "load_error_after_tensors"})
NAN_VALUES = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _bad(message: str) -> InvalidInputError:
    return InvalidInputError(f"fault_injection: {message}", field="fault_injection")


def validate(spec) -> None:
    """Raise InvalidInputError(field="fault_injection") for anything but a well-formed spec."""
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise _bad("must be an object (or unset)")
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise _bad(f"unknown keys {unknown}; known: {', '.join(sorted(KEYS))}")
    for kind in STEP_KINDS:
        step, rid = spec.get(f"{kind}_at_step"), spec.get(f"{kind}_request_id")
        if step is not None and (not is_int(step) or step < 1):
            raise _bad(f"{kind}_at_step must be an integer >= 1 (steps count from 1)")
        if rid is not None and (not isinstance(rid, str) or not rid):
            raise _bad(f"{kind}_request_id must be a non-empty string")
        if rid is not None and step is None:
            raise _bad(f"{kind}_request_id needs {kind}_at_step")
    if spec.get("nan_value", "nan") not in NAN_VALUES:
        raise _bad(f"nan_value must be one of {', '.join(NAN_VALUES)}")
    after = spec.get("load_error_after_tensors")
    if after is not None and (not is_int(after) or after < 0):
        raise _bad("load_error_after_tensors must be an integer >= 0")


class FaultInjector:
    """The engine's hooks call this; with no spec every hook is a no-op."""

    def __init__(self, spec: dict | None):
        validate(spec)
        self.spec = dict(spec or {})
        self.fired: dict[str, int] = {}  # kind -> the step it fired in (a retry in that step fires again)

    def _hits(self, kind: str, step: int, request_ids: list[str]) -> list[str]:
        at = self.spec.get(f"{kind}_at_step")
        if at is None or step < at or self.fired.get(kind, step) != step:
            return []
        rid = self.spec.get(f"{kind}_request_id")
        hit = list(request_ids) if rid is None else [r for r in request_ids if r == rid]
        if hit:
            self.fired[kind] = step
        return hit

    def before_run(self, step: int, scheduled) -> None:
        """A dead device or an out-of-memory error in this step's forward."""
        if not self.spec:
            return
        ids = [seq.request_id for seq, _ in scheduled]
        if self._hits("dead", step, ids):
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected by fault_injection)")
        if self._hits("oom", step, ids):
            import torch

            raise torch.OutOfMemoryError("CUDA out of memory (injected by fault_injection)")

    def poison_logits(self, step: int, seqs, logits):
        """NaN (or inf) in the logits row of the target request, when it samples in this step."""
        if not self.spec:
            return logits
        hit = set(self._hits("nan", step, [seq.request_id for seq in seqs]))
        if not hit:
            return logits
        logits = logits.clone()
        for row, seq in enumerate(seqs):
            if seq.request_id in hit:
                logits[row, 0] = NAN_VALUES[self.spec.get("nan_value", "nan")]
        return logits

    def before_detokenize(self, step: int, seq) -> None:
        if self.spec and self._hits("detokenize_error", step, [seq.request_id]):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer failure (fault_injection)")

    def wrap_weights(self, weights):
        """The weight iterator, raising an I/O error after `load_error_after_tensors` tensors."""
        after = self.spec.get("load_error_after_tensors")
        if after is None:
            yield from weights
            return
        for i, item in enumerate(weights):
            if i == after:
                break
            yield item
        raise OSError(errno.EIO, f"Input/output error reading the weights after {after} tensors "
                                 "(injected by fault_injection)")
