"""A fake of RunPod's serverless batch jobs API (beta) on the fake /v2 REST API: a batch's child
requests become jobs of that fake once the batch is finalized, and run on the project's handler
`Worker` like any /run job (so a child's output is the worker's job output, its error the
worker's error as /status shows it).

Built from RunPod's docs, "Batch jobs": https://docs.runpod.io/serverless/advanced-workflows/batch-jobs
(source: github.com/runpod/docs, serverless/advanced-workflows/batch-jobs.mdx, commit a900806e).
What they say, and the fake does:
- POST /v2/{endpoint_id}/batch: the body is a top-level JSON array of `{"input": ...}` (`[]`: an
  empty batch); the answer `{"id", "status": "DRAFT"}`.
- POST .../batch/{id}/requests `{"requests": [{"input": ...}, ...]}` appends to a DRAFT batch;
  a body is at most 10 MiB. POST .../batch/{id}/finalize: DRAFT -> FINALIZED, requests locked,
  and they start. DELETE .../batch/{id}/requests/{requestId} takes one out of a DRAFT batch.
- GET .../batch/{id}: `{"id", "endpointId", "status", "requestTotal", "requestInProgress",
  "requestCompleted", "requestFailed", "createdAt"}` (epoch milliseconds). A batch at work or
  done stays FINALIZED (no RUNNING or COMPLETED): all its requests are done when
  requestCompleted + requestFailed == requestTotal; FAILED and CANCELLED are the batch's own ends.
- GET .../batch/{id}/requests?offset=&limit= (limit 50 by default): `{"requests": [{"id",
  "status", "output" | "error", "startedAt", "completedAt"}], "total", "offset", "limit", "hasMore"}`.
- POST .../batch/{id}/cancel: queued requests are cancelled, running ones finish. GET .../batch
  lists the endpoint's batches, newest first.
- 5,000 requests a batch, 10 active batches an endpoint; requests run in an unspecified order;
  a failed child does not fail the batch.
What they leave open, and the fake assumes (a client should rely on no more than this):
- an add call answers `{"id", "status", "requests": [{"id"}, ...]}`, the new requests' ids in
  the order sent (a create call with requests answers no request ids, as documented);
- refusals: 400 `{"error"}` (a bad body, a batch not DRAFT, past 5,000 requests), 413 past
  10 MiB, 429 past 10 active batches, 404 an unknown batch or request;
- a page holds at most 100 children; children of a DRAFT batch show IN_QUEUE; `startedAt` and
  `completedAt` are ISO 8601; a failed child counts in requestFailed whatever its end (FAILED,
  CANCELLED, TIMED_OUT);
- the list's order is a fixed shuffle of the batch's children, and they start in another one.
PUT .../batch/{id} (renaming a batch) is not served."""
from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from handler.http.jobs import COMPLETED, FAILED, FINAL, IN_PROGRESS, IN_QUEUE
from tests.fakes.runpod_rest_api import MAX_BODY, FakeRestAPI

MAX_REQUESTS = 5000
MAX_ACTIVE = 10
MAX_PAGE = 100
DEFAULT_PAGE = 50


@dataclass
class FakeBatch:
    id: str
    created_ms: int
    status: str = "DRAFT"
    inputs: dict[str, Any] = field(default_factory=dict)  # child id -> input, in the order added
    order: list[str] = field(default_factory=list)  # the list's order, fixed at finalize


class FakeBatchAPI(FakeRestAPI):
    """FakeRestAPI plus the batch routes. `batch_calls`: (method, what) of each batch call, what
    one of create, add, finalize, summary, page, cancel, delete, list. Limits are attributes, so
    a test can shrink them; `fail_batch(id)` makes a batch FAILED (a systemic failure);
    `names_added = False` makes add calls answer without the new requests' ids."""

    def __init__(self, make_worker, *, seed: int = 0, **kwargs):
        super().__init__(make_worker, **kwargs)
        self.batches: dict[str, FakeBatch] = {}
        self.batch_calls: list[tuple[str, str]] = []
        self.max_requests, self.max_body, self.max_active, self.max_page = MAX_REQUESTS, MAX_BODY, MAX_ACTIVE, MAX_PAGE
        self.rng = random.Random(seed)
        self.names_added = True
        self.batch_lock = threading.Lock()  # not the store's lock: store calls take that one

    # -- the test's side ------------------------------------------------------------------
    def children(self, batch_id: str) -> dict[str, dict]:
        """Each child's view as the list shows it, by id."""
        batch = self.batches[batch_id]
        return {cid: self._child(batch, cid) for cid in list(batch.inputs)}

    def fail_batch(self, batch_id: str) -> None:
        batch = self.batches[batch_id]
        self._cancel_queued(batch)
        batch.status = FAILED

    # -- HTTP --------------------------------------------------------------------------------
    def _dispatch(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(req.path)
        parts = url.path.strip("/").split("/")
        if len(parts) < 3 or parts[2] != "batch":
            return super()._dispatch(req, method)
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        if req.headers.get("Authorization") != f"Bearer {self.api_key}":
            self.violations.append(f"bad Authorization on {method} {url.path}")
            return self._reply(req, 401, {"error": "Unauthorized"})
        if parts[0] != "v2" or parts[1] != self.endpoint:
            return self._reply(req, 404, {"error": f"endpoint not found: {url.path}"})
        route = self._route(method, parts[3:])
        with self.batch_lock:
            self.batch_calls.append((method, route or "unknown"))
        if route is None:
            self.violations.append(f"unexpected {method} {url.path}")
            return self._reply(req, 404, {"error": "not found"})
        if len(body) > self.max_body:
            return self._reply(req, 413, {"error": f"the body is {len(body)} bytes: past 10 MiB"})
        code, answer = getattr(self, "_" + route)(parts[3:], body, parse_qs(url.query))
        return self._reply(req, code, answer)

    @staticmethod
    def _route(method: str, rest: list[str]) -> str | None:
        shape = (method, len(rest), rest[1] if len(rest) > 1 else None)
        return {("POST", 0, None): "create", ("GET", 0, None): "list", ("GET", 1, None): "summary",
                ("POST", 2, "requests"): "add", ("GET", 2, "requests"): "page", ("POST", 2, "finalize"): "finalize",
                ("POST", 2, "cancel"): "cancel", ("DELETE", 3, "requests"): "delete"}.get(shape)

    # -- the routes: each (rest of the path, body, query) -> (HTTP status, answer) --------------
    def _create(self, rest, body, query):
        requests = _json(body)
        if not isinstance(requests, list):
            return 400, {"error": "the body must be a JSON array of requests"}
        if sum(self._active(b) for b in list(self.batches.values())) >= self.max_active:
            return 429, {"error": f"{self.max_active} batches are active on this endpoint"}
        batch = FakeBatch(f"batch_{uuid.uuid4().hex[:12]}", int(time.time() * 1000))
        with self.batch_lock:
            self.batches[batch.id] = batch
        if requests:
            code, answer = self._append(batch, requests)
            if code != 200:
                return code, answer
        return 200, {"id": batch.id, "status": batch.status}

    def _add(self, rest, body, query):
        batch = self.batches.get(rest[0])
        payload = _json(body)
        if batch is None:
            return 404, {"error": "batch not found"}
        if not isinstance(payload, dict) or not isinstance(payload.get("requests"), list):
            return 400, {"error": "the body must be {\"requests\": [...]}"}
        return self._append(batch, payload["requests"])

    def _append(self, batch: FakeBatch, requests: list) -> tuple[int, dict]:
        if batch.status != "DRAFT":
            return 400, {"error": f"the batch is {batch.status}, not DRAFT"}
        if not all(isinstance(r, dict) and "input" in r for r in requests):
            return 400, {"error": "each request must be an object with input"}
        if len(batch.inputs) + len(requests) > self.max_requests:
            return 400, {"error": f"a batch holds at most {self.max_requests} requests"}
        ids = [f"req_{uuid.uuid4().hex[:12]}" for _ in requests]
        with self.batch_lock:
            batch.inputs.update(zip(ids, (r["input"] for r in requests)))
        answer = {"id": batch.id, "status": batch.status}
        return 200, {**answer, "requests": [{"id": i} for i in ids]} if self.names_added else answer

    def _finalize(self, rest, body, query):
        batch = self.batches.get(rest[0])
        if batch is None:
            return 404, {"error": "batch not found"}
        if batch.status != "DRAFT":
            return 400, {"error": f"the batch is {batch.status}, not DRAFT"}
        batch.order = list(batch.inputs)
        self.rng.shuffle(batch.order)
        batch.status = "FINALIZED"
        for cid in self.rng.sample(batch.order, len(batch.order)):
            self.submit(batch.inputs[cid], jid=cid)
        return 200, {"id": batch.id, "status": batch.status}

    def _delete(self, rest, body, query):
        batch = self.batches.get(rest[0])
        if batch is None or rest[2] not in batch.inputs:
            return 404, {"error": "request not found"}
        if batch.status != "DRAFT":
            return 400, {"error": f"the batch is {batch.status}, not DRAFT"}
        with self.batch_lock:
            del batch.inputs[rest[2]]
        return 200, {"id": rest[2], "deleted": True}

    def _cancel(self, rest, body, query):
        batch = self.batches.get(rest[0])
        if batch is None:
            return 404, {"error": "batch not found"}
        self._cancel_queued(batch)
        batch.status = "CANCELLED"
        return 200, {"id": batch.id, "status": batch.status}

    def _summary(self, rest, body, query):
        batch = self.batches.get(rest[0])
        if batch is None:
            return 404, {"error": "batch not found"}
        states = [c["status"] for c in self.children(batch.id).values()]
        return 200, {"id": batch.id, "endpointId": self.endpoint, "status": batch.status,
                     "requestTotal": len(states), "requestInProgress": states.count(IN_PROGRESS),
                     "requestCompleted": states.count(COMPLETED),
                     "requestFailed": sum(s in FINAL and s != COMPLETED for s in states), "createdAt": batch.created_ms}

    def _page(self, rest, body, query):
        batch = self.batches.get(rest[0])
        if batch is None:
            return 404, {"error": "batch not found"}
        offset = int(query.get("offset", ["0"])[0])
        limit = min(int(query.get("limit", [str(DEFAULT_PAGE)])[0]), self.max_page)
        ids = batch.order or list(batch.inputs)
        page = [self._child(batch, cid) for cid in ids[offset:offset + limit]]
        return 200, {"requests": page, "total": len(ids), "offset": offset, "limit": limit,
                     "hasMore": offset + len(page) < len(ids)}

    def _list(self, rest, body, query):
        newest = sorted(self.batches.values(), key=lambda b: b.created_ms, reverse=True)
        return 200, {"batches": [{"id": b.id, "status": b.status} for b in newest]}

    # -- the batch's children, as jobs of the REST fake ---------------------------------------
    def _child(self, batch: FakeBatch, cid: str) -> dict:
        job = self.store.get(cid) if batch.order else None
        if job is None:
            return {"id": cid, "status": IN_QUEUE}
        with self.lock:
            out: dict[str, Any] = {"id": cid, "status": job.status}
            if job.status == COMPLETED:
                out["output"] = job.output
            elif job.status == FAILED:
                out["error"] = job.error
            for key, at in (("startedAt", job.started), ("completedAt", job.finished)):
                if at is not None:
                    out[key] = _iso(at)
        return out

    def _active(self, batch: FakeBatch) -> bool:
        if batch.status == "DRAFT":
            return True
        return batch.status == "FINALIZED" and any(c["status"] not in FINAL for c in self.children(batch.id).values())

    def _cancel_queued(self, batch: FakeBatch) -> None:
        for cid in batch.order:
            job = self.store.get(cid)
            if job is not None and job.status == IN_QUEUE:
                self.cancel(cid)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except json.JSONDecodeError:
        return None


def _iso(monotonic_at: float) -> str:
    """A time.monotonic() instant as ISO 8601 UTC wall-clock time."""
    wall = time.time() - (time.monotonic() - monotonic_at)
    return datetime.fromtimestamp(wall, timezone.utc).isoformat().replace("+00:00", "Z")
