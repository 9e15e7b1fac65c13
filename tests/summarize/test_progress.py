"""What a summarize run shows while it runs: the token bar moves with the tokens of the
documents in flight, the bars' elapsed time ticks, and each document prints one line as it ends."""
from __future__ import annotations

import asyncio

from summarize.inputs import Document
from summarize.runner import Attempt, Batch, Options
from summarize.store import ResultStore

IN_FLIGHT_TOKENS = 1234


class HeldRunner:
    """One attempt that has used IN_FLIGHT_TOKENS tokens and ends only when released."""

    label = "held"

    def __init__(self):
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.running = False

    async def start(self) -> None:
        pass

    async def attempt(self, doc, job_input) -> Attempt:
        self.running = True
        self.started.set()
        await self.release.wait()
        self.running = False
        final = {"text": "- the summary", "finish_reason": "stop",
                 "usage": {"prompt_tokens": 1200, "completion_tokens": 40}}
        return Attempt("COMPLETED", [final], job_id="job-1")

    def tokens_in_flight(self) -> int:
        return IN_FLIGHT_TOKENS if self.running else 0

    def gpu_seconds(self, elapsed: float) -> float | None:
        return None

    async def close(self) -> None:
        pass


async def _until(condition, limit_s: float = 30.0) -> bool:
    """Wait until `condition()` holds (polling), at most `limit_s`; whether it did."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def test_the_token_bar_moves_while_a_document_runs(tmp_path, capsys):
    doc = Document("report.md", "report.md", "0" * 64, "A long report.")
    store = ResultStore(str(tmp_path / "r.jsonl"))
    store.open([doc])
    runner, printed = HeldRunner(), []
    batch = Batch([doc], store, runner, Options(), progress=True, notify=printed.append)
    shown = []

    async def main():
        task = asyncio.create_task(batch.run({}))
        await runner.started.wait()

        def drawn():
            shown.append(capsys.readouterr().err)
            return "1.23ktok" in "".join(shown) and "00:01" in "".join(shown)

        moved = await _until(drawn)
        finished_before = list(printed)
        runner.release.set()
        await task
        return moved, finished_before

    moved, finished_before = asyncio.run(main())
    store.close()
    # while the document ran: its tokens so far on the token bar, and the elapsed time moving
    assert moved, "".join(shown)[-500:]
    assert finished_before == []
    assert printed == [printed[0]] and printed[0].startswith("report.md: ok (1 chunk, 1240 tokens, ")
