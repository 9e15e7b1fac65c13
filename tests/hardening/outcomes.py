"""How a job ended, read the way a client reads /status: the text of a COMPLETED job (any
output shape), the error object of a FAILED one, and the checks every ending must pass."""
from __future__ import annotations

import json

from tests.handler.sse import parse_sse

CONTRACT_KEYS = {"code", "message", "retryable"}


def output_text(output) -> str | None:
    """The text a COMPLETED job's output carries (our items, OpenAI objects, SSE or chunk
    lists); None when the output is not a list of known items."""
    if not isinstance(output, list) or not output:
        return None
    parts = []
    for item in output:
        if isinstance(item, str):  # a raw SSE stream item
            chunks = parse_sse(item)
        elif isinstance(item, list):  # chunk objects (RAW_OPENAI_OUTPUT=false)
            chunks = item
        elif isinstance(item, dict) and "text" in item:
            parts.append(item["text"])
            continue
        elif isinstance(item, dict) and item.get("object") == "list":
            parts.append(json.dumps(item["data"]))  # /v1/models
            continue
        elif isinstance(item, dict) and "choices" in item:
            chunks = [item]
        else:
            return None
        for chunk in chunks:
            for choice in chunk.get("choices", []):
                message = choice.get("message") or choice.get("delta") or {}
                parts.append(message.get("content") or choice.get("text") or "")
    return "".join(parts)


def finish_reason(output) -> str | None:
    last = output[-1] if isinstance(output, list) and output else None
    if isinstance(last, dict) and "finish_reason" in last:
        return last["finish_reason"]
    if isinstance(last, dict) and last.get("object") == "list":
        return "models"
    if isinstance(last, dict) and last.get("choices"):
        return last["choices"][0].get("finish_reason")
    chunks = parse_sse(last) if isinstance(last, str) else last if isinstance(last, list) else []
    reasons = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    return next((r for r in reversed(reasons) if r), None)


def error_object(error) -> dict | None:
    """The parsed error of a FAILED job, or None when it is not the contract's JSON object."""
    try:
        err = json.loads(error) if isinstance(error, str) else None
    except json.JSONDecodeError:
        return None
    if not isinstance(err, dict) or not CONTRACT_KEYS <= set(err) or not isinstance(err["code"], str):
        return None
    return err


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process (Linux /proc), in MiB."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def final_stats(lines: list[str]) -> dict:
    """The engine stats the worker logs when it exits."""
    for line in reversed(lines):
        if "worker exit: engine stats " in line:
            return json.loads(line.split("worker exit: engine stats ", 1)[1])
    raise AssertionError("the worker logged no exit stats")


def log_problems(output: str) -> list[str]:
    """Lines of a worker's log that no run should have: a bug caught by the handler's last resort,
    a crash in the SDK's loop, a result that could not be posted. (Engine faults log tracebacks
    on purpose: an injected fault's is expected.)"""
    bad = ("] unexpected error", "Uncaught exception", "Error handling job", "Failed to return job results",
           "Error while returning job result", "Task failed during shutdown drain", "Failed to get job")
    return [line for line in output.splitlines() if any(b in line for b in bad)]


def assert_clean_exit(fake, proc, rc) -> str:
    """The worker process exited 0, the fake control plane saw no protocol violation and the log
    has no problem line; returns the log."""
    out = proc.output
    assert rc == 0, out[-3000:]
    assert fake.violations == [] and not log_problems(out), (fake.violations, log_problems(out))
    return out
