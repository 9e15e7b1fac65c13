"""`summarize --endpoint ID --batch`: the documents' jobs go through RunPod's batch jobs API
instead of one /run call each. Attempts that arrive together are gathered into batches (5,000
requests at most each, added in calls of at most 10 MiB, at most 10 batches unfinished at once),
each batch is finalized and then watched until every document has its result. Everything the
API answered is recorded beside the results file first, so a rerun after an interruption
collects the batches already made and submits only what no batch holds."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from summarize import batch
from summarize.batch import MAX_ACTIVE_BATCHES, BatchAPI, batch_groups, fits_one_call
from summarize.batch_state import BatchState, state_path
from summarize.batch_submit import Submitter
from summarize.batch_watch import Pending, Watch, failed
from summarize.endpoint import EndpointRunner
from summarize.inputs import Document
from summarize.runner import Attempt, FatalError
from summarize.store import ResultStore

log = logging.getLogger("summarize")

POLL_S = (2.0, 60.0)  # seconds before the first look at a batch, and the longest wait between two looks
COLLECT_S = 0.05  # the run's first attempts (all at once) within this much of each other share batches
RETRY_COLLECT_S = 2.0  # retries, which come after a jittered backoff each: a longer wait, fewer batches


class BatchRunner:
    """A Runner (summarize.runner) on one endpoint's batch jobs, its records beside `results_path`.
    Made before the results store is opened: the failed lines it drops name children already
    written. `left_running`, after `close()`: the batches that still hold documents of this run
    (running, or a draft to finish)."""

    def __init__(self, endpoint_id: str, *, results_path: str, api_key: str | None = None,
                 base_url: str | None = None, poll_s: tuple[float, float] | None = None,
                 notify: Callable[[str], None] = log.info):
        # the /run runner's key and base URL rules and its /health check at start
        self.probe = EndpointRunner(endpoint_id, api_key=api_key, base_url=base_url, concurrency=1, notify=notify)
        self.api = BatchAPI(self.probe.base_url, endpoint_id, self.probe.client.api_key)
        self.results_path = results_path
        self.state = BatchState(state_path(results_path), endpoint_id, _written(results_path)).load()
        self.label = f"endpoint {endpoint_id} (batch jobs)"
        self.notify = notify
        self.submitter = Submitter(self.api, self.state, self._call, notify)
        self.poll_s = poll_s or POLL_S
        self.left_running: list[str] = []
        self._waiting: list[Pending] = []  # attempts not in a batch yet
        self._pending: list[Pending] = []  # every attempt of the run (a fatal error answers them all)
        self._watches: dict[str, Watch] = {}
        self._tasks: set[asyncio.Task] = set()
        self._flusher: asyncio.Task | None = None
        self._resumed = False
        self._touched: set[str] = set()  # batches this run made or resumed
        self._slots = asyncio.Semaphore(MAX_ACTIVE_BATCHES)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="summarize-batch")

    async def start(self) -> None:
        await self.probe.start()
        if self.state.elsewhere:
            self.notify(f"{self.state.path} also records batches of another endpoint, left as they are: "
                        + ", ".join(self.state.elsewhere))
        if self.state.open_batches():
            self.notify(f"{len(self.state.open_batches())} batches recorded in {self.state.path}: their documents "
                        "are collected, not submitted again")

    async def attempt(self, doc: Document, job_input: dict) -> Attempt:
        if not fits_one_call({"input": job_input}):
            return failed("too_large", "the document as a job is more than one batch call may carry "
                          f"({batch.MAX_BODY_BYTES} bytes)", False)
        pending = Pending(doc, job_input, asyncio.get_running_loop().create_future())
        self._waiting.append(pending)
        self._pending.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = self._spawn(self._flush())
        return await pending.future  # a Ctrl-C cancels only this wait: the batch goes on running

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- gathering attempts into batches ----------------------------------------------------
    async def _flush(self) -> None:
        """Submit what waits, in batches, until nothing does; the first round resumes the
        batches recorded by an earlier run. A fatal error answers every attempt of the run."""
        try:
            while self._waiting:
                await self._settle()
                group, self._waiting = [p for p in self._waiting if p.waiting], []
                if not self._resumed:
                    self._resumed = True
                    group = await self._resume(group)
                for part in batch_groups(group):
                    await self._submit(part)
        except FatalError as exc:
            for pending in self._pending:
                pending.fail(exc)
        except Exception as exc:  # noqa: BLE001 - a client bug fails the documents it held, with the reason
            log.exception("submitting a batch failed in the client")
            for pending in self._waiting + [p for p in self._pending if p.waiting and not self._watched(p)]:
                pending.fail(exc)

    async def _settle(self) -> None:
        """Wait until no attempt arrived for a while: COLLECT_S for the first round, which the
        run starts at once, RETRY_COLLECT_S for the retries after it."""
        seen = -1
        while seen != len(self._waiting):
            seen = len(self._waiting)
            await asyncio.sleep(RETRY_COLLECT_S if self._resumed else COLLECT_S)

    def _watched(self, pending: Pending) -> bool:
        return any(pending in w.children.values() for w in self._watches.values())

    async def _submit(self, part: list[Pending]) -> None:
        """One new batch for `part`. Each batch holds one of the slots (batches unfinished at
        once) from its creation to the end of its watch."""
        await self._slots.acquire()
        batch_id = None
        try:
            batch_id = await self.submitter.create(part)
        finally:
            if batch_id is None:
                self._slots.release()
        if batch_id is not None:
            self._touched.add(batch_id)
            await self._complete(batch_id, {}, part)

    async def _complete(self, batch_id: str, children: dict[str, Pending], part: list[Pending]) -> None:
        """Fill the DRAFT batch (which holds `children` already) with `part`, finalize it and
        watch it. The caller took its slot."""
        watched = False
        try:
            children = {**children, **await self.submitter.fill(batch_id, part)}
            watched = await self.submitter.finalize(batch_id, children)
            if watched:
                self._watch(batch_id, children)
        except FatalError:
            await self.submitter.drop(batch_id)
            raise
        finally:
            if not watched:
                self._slots.release()

    # -- batches of an earlier run --------------------------------------------------------
    async def _resume(self, group: list[Pending]) -> list[Pending]:
        """Attach the documents of `group` to the children recorded for them (the same
        request_id: same document, content and options), watch the finalized batches, finish
        the drafts with documents no batch holds; the rest, in order, to submit anew."""
        by_rid = {p.request_id: p for p in group}
        drafts = []
        for record in self.state.open_batches():
            mine = {cid: by_rid.pop(rid) for cid, rid in self.state.unsettled(record).items() if rid in by_rid}
            if not record.finalized and await self.submitter.status(record.id) is None:
                await self.submitter.drop(record.id)  # gone, failed or cancelled: submit its documents anew
                by_rid.update((p.request_id, p) for p in mine.values())
            elif not record.finalized:
                drafts.append((record.id, mine))
            elif mine:
                self.notify(f"batch {record.id}: collecting {len(mine)} documents an earlier run submitted")
                self._touched.add(record.id)
                await self._slots.acquire()
                self._watch(record.id, mine)
            else:
                self.notify(f"batch {record.id}: none of its requests is for a document of this run; left as it is")
        rest = [p for p in group if p.request_id in by_rid]
        for batch_id, mine in drafts:
            room = batch.MAX_BATCH_REQUESTS - len(mine)
            part, rest = rest[:room], rest[room:]
            if not mine and not part:
                await self.submitter.drop(batch_id)
                continue
            self.notify(f"batch {batch_id}: finishing the draft an earlier run began ({len(mine)} documents in it, "
                        f"{len(part)} more)")
            self._touched.add(batch_id)
            await self._slots.acquire()
            await self._complete(batch_id, mine, part)
        return rest

    def _watch(self, batch_id: str, children: dict[str, Pending]) -> None:
        watch = Watch(self.api, self._call, batch_id, children, self.poll_s)
        self._watches[batch_id] = watch
        self._spawn(self._follow(watch))

    async def _follow(self, watch: Watch) -> None:
        try:
            await watch.run()
        except FatalError as exc:
            for pending in self._pending:
                pending.fail(exc)
        except Exception as exc:  # noqa: BLE001 - a client bug fails the batch's documents, with the reason
            log.exception("watching batch %s failed in the client", watch.batch_id)
            watch.fail(exc)
        finally:
            self._slots.release()

    # -- the Runner's other parts ---------------------------------------------------------
    def gpu_seconds(self, elapsed: float) -> float | None:
        seconds = [s for w in self._watches.values() for s in w.seconds]
        return sum(seconds) if seconds else None

    async def close(self) -> None:
        """Stop watching (the batches go on running on the endpoint); note which still hold
        documents of this run; drop the records file when nothing is left to collect."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.state.written |= _written(self.results_path)  # the lines this run wrote too
        mine = {p.request_id for p in self._pending}
        self.left_running = [b.id for b in reversed(self.state.open_batches()) if b.id in self._touched
                             and (not b.finalized or mine & set(self.state.unsettled(b).values()))]
        self.state.remove_if_done()
        self._pool.shutdown(wait=False, cancel_futures=True)
        await self.probe.close()


def _written(results_path: str) -> set[str]:
    """The job ids of the results file's lines: children whose result was written."""
    return {line["job_id"] for line in ResultStore(results_path).read() if isinstance(line.get("job_id"), str)}
