"""What a summarize run tells its reader: the Markdown report (every document, its summary
or its failure) and the closing summary printed by the command."""
from __future__ import annotations

from datetime import datetime, timezone

from summarize.inputs import Document
from summarize.names import markdown, shown
from summarize.runner import RunStats




def _tokens(line: dict) -> int:
    return (line.get("usage") or {}).get("total_tokens", 0)


def markdown_report(docs: list[Document], lines: dict, stats: RunStats, runner: str) -> str:
    """Every document of the run in input order; one without a line is shown as not finished."""
    rows = [(d, lines.get(d.key)) for d in docs]
    counts = {"ok": 0, "truncated": 0, "failed": 0, "not finished": 0}
    for _, line in rows:
        counts[line["status"] if line else "not finished"] += 1
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    out = ["# Summaries", "", f"{len(docs)} documents ({head}); {runner}; {when}.", ""]
    if stats.interrupted:
        out += ["**The run was interrupted**: rerun the same command to finish the rest.", ""]
    out += ["| Document | Status | Chunks | Tokens | Note |", "| --- | --- | --- | --- | --- |"]
    for d, line in rows:
        if line is None:
            out.append(f"| {markdown(d.doc)} | not finished | | | |")
            continue
        note = ""
        if line["status"] == "failed":
            note = f"{line['error']['code']}: {line['error'].get('message', '')}"
        elif line.get("retried_after"):
            note = "retried after " + ", ".join(line["retried_after"])
        if line["status"] == "truncated":
            note = (note + "; " if note else "") + "summary cut at its token limit"
        out.append(f"| {markdown(d.doc)} | {line['status']} | {line.get('chunks') or ''} | {_tokens(line) or ''} | "
                   f"{markdown(note[:160])} |")
    for d, line in rows:
        out += ["", f"## {markdown(d.doc)}", ""]
        if line is None:
            out.append("*Not finished: the run was interrupted before this document.*")
        elif line["status"] == "failed":
            err = line["error"]
            out.append(f"**Failed** ({err['code']}): {markdown(err.get('message', ''))}")
        else:
            meta = f"{line['status']}, {line.get('chunks', 1)} chunk{'s' if line.get('chunks', 1) != 1 else ''}, " \
                   f"{_tokens(line)} tokens"
            out += [f"*{meta}*", "", line["summary"]]
    return "\n".join(out) + "\n"


def closing_summary(stats: RunStats, runner: str, out_path: str, report_path: str | None,
                    failed: list[dict]) -> str:
    """The lines the command prints when it ends (also after Ctrl-C)."""
    c = stats.counts
    done = f"{c['ok']} ok, {c['truncated']} truncated, {c['failed']} failed"
    head = f"{stats.finished} of {stats.total - stats.skipped} documents finished: {done}"
    if stats.skipped:
        head += f" ({stats.skipped} done before, skipped)"
    lines = [f"summarize: {head}",
             f"  {runner}; {stats.elapsed:.1f}s; tokens {stats.prompt_tokens} prompt + {stats.completion_tokens} "
             f"completion" + (f"; GPU-seconds {stats.gpu_seconds:.1f}" if stats.gpu_seconds is not None else "")
             + (f"; {stats.retries} retries" if stats.retries else "")]
    if stats.interrupted:
        left = stats.total - stats.skipped - stats.finished
        lines.append(f"  interrupted: {left} documents not finished; rerun the same command to resume")
    for line in failed:
        error = line["error"]
        lines.append(f"  failed: {shown(line['doc'])}: {shown(error['code'])}: {shown(error.get('message', '')[:200])}")
    lines.append(f"  results: {out_path}" + (f"; report: {report_path}" if report_path else ""))
    return "\n".join(lines)
