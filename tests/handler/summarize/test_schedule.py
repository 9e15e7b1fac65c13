"""Summarize jobs sharing one worker: a short document is not held back by a long one's
chunks (timed on a simulated CPU clock, not the wall), and the gate's admission order."""
from __future__ import annotations

import asyncio

import pytest

from handler.local import run_job
from handler.summarize.schedule import CallGate
from summarize.inputs import Document
from summarize.runner import Options
from tests.handler.conftest import settings_for
from tests.handler.summarize.sim_engine import SimEngine
from tests.summarize.notes import ENGLISH, ENV, long_text


async def _inline(fn, *args, **kwargs):  # asyncio.to_thread without a thread: nothing runs on real time
    return fn(*args, **kwargs)


def _job(name: str, text: str) -> dict:
    return Options(max_summary_tokens=12).job_input(Document(name, name, name, text))


def _finish_times(tiny_llama_dir, docs: dict[str, str]) -> dict[str, float]:
    """Each document's job run at once in one worker on the simulated engine: when it ended
    (simulated seconds), in the order given."""
    from handler.engine_setup import build_engine
    from handler.worker import Worker

    engines = []

    def factory(settings, on_progress=None):
        engines.append(SimEngine(build_engine(settings, on_progress)))
        return engines[-1]

    async def main():
        worker = Worker(settings_for(tiny_llama_dir, **ENV), engine_factory=factory)
        ends = {}

        async def one(name, text):
            result = await run_job(worker.handle, {"id": name, "input": _job(name, text)})
            assert result["status"] == "COMPLETED", result
            ends[name] = engines[0].now

        try:
            await asyncio.gather(*(one(name, text) for name, text in docs.items()))
        finally:
            await worker.aclose()
        return ends

    return asyncio.run(main())


def test_a_short_document_is_not_held_back_by_a_long_one(tiny_llama_dir, monkeypatch):
    monkeypatch.setattr(asyncio, "to_thread", _inline)
    alone = _finish_times(tiny_llama_dir, {"short": ENGLISH})["short"]
    long_alone = _finish_times(tiny_llama_dir, {"long": long_text()})["long"]
    together = _finish_times(tiny_llama_dir, {"long": long_text(), "short": ENGLISH})
    assert long_alone > 5 * alone  # the long one is many calls: 6 map chunks and a reduce step
    # within twice its time alone (without the gate it shares every step with the long one's
    # chunk prefills and ends about when they do)
    assert together["short"] <= 2 * alone, (together, alone)
    assert together["long"] <= long_alone + 2 * alone  # and the long one hardly later than alone


def test_a_long_document_in_one_call_waits_while_a_short_one_runs(tiny_llama_dir, monkeypatch):
    from handler.summarize import job
    from tests.handler.summarize import sim_engine

    monkeypatch.setattr(asyncio, "to_thread", _inline)
    monkeypatch.setattr(job, "SHORT_PROMPT_TOKENS", 350)  # the short prompt is 307 tokens, the medium 425
    monkeypatch.setattr(sim_engine, "TOKEN_COST", 0.5)  # a prefill as dear as a CPU makes it
    medium = long_text(5)  # one call in the 512-token context: a last call, but a long one
    alone = _finish_times(tiny_llama_dir, {"short": ENGLISH})["short"]
    together = _finish_times(tiny_llama_dir, {"short": ENGLISH, "medium": medium})
    # the medium one comes second and is not started while the short one runs
    assert together["short"] <= 2 * alone and together["short"] < together["medium"], (together, alone)


def _admit_order(gate: CallGate, calls: list[tuple[str, bool, int]], prefill_first: bool = True) -> list[str]:
    """The order in which `calls` (name, final, size) are admitted, each holding its slot until
    the next admission happens; a map call reports its prefill done at once."""
    order: list[str] = []

    async def one(name, final, size, release):
        async with gate.slot(final=final, size=size, kv=100) as slot:
            order.append(name)
            if prefill_first:
                slot.prefilled()
            await release.wait()

    async def main():
        releases = [asyncio.Event() for _ in calls]
        tasks = [asyncio.create_task(one(*c, r)) for c, r in zip(calls, releases)]
        for _ in range(len(calls)):
            await asyncio.sleep(0.01)
            if order:
                releases[[c[0] for c in calls].index(order[-1])].set()  # the latest admitted ends
        for r in releases:
            r.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    return order


def test_the_gate_runs_last_calls_and_short_documents_first():
    gate = CallGate(kv_tokens=100, exclusive=False)  # room for one call at a time
    calls = [("first", False, 9000), ("map-long", False, 9000), ("map-mid", False, 3000),
             ("final-long", True, 9000), ("final-short", True, 200)]
    assert _admit_order(gate, calls) == ["first", "final-short", "final-long", "map-mid", "map-long"]
    assert gate.running == gate.kv_in_use == gate.finals_running == gate.maps_prefilling == 0


@pytest.mark.parametrize("exclusive, expected", [(True, 1), (False, 3)])
def test_on_the_cpu_map_prefills_go_one_at_a_time(exclusive, expected):
    gate = CallGate(kv_tokens=10_000, exclusive=exclusive)
    admitted = []

    async def main():
        async def one(i):
            async with gate.slot(final=False, size=500, kv=100):
                admitted.append(i)
                await asyncio.sleep(3600)

        tasks = [asyncio.create_task(one(i)) for i in range(3)]
        await asyncio.sleep(0.05)
        seen = len(admitted)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return seen

    assert asyncio.run(main()) == expected  # none reports its prefill done: on the CPU the others wait
    assert gate.running == gate.kv_in_use == gate.maps_prefilling == 0 and not gate.waiting


def test_a_call_past_its_deadline_leaves_the_queue():
    gate = CallGate(kv_tokens=100, exclusive=True)

    async def main():
        async with gate.slot(final=True, size=1, kv=100):
            with pytest.raises(TimeoutError):
                async with gate.slot(final=True, size=1, kv=100, timeout=0.01):
                    pass
            assert not gate.waiting
        async with gate.slot(final=True, size=1, kv=100, timeout=1):
            assert gate.running == 1

    asyncio.run(main())
    assert gate.running == gate.kv_in_use == 0
