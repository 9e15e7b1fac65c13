"""RunPod's serverless batch jobs API (beta) as `summarize --batch` calls it: create a batch,
add requests to it, finalize it, read its summary and page its child requests; and how a set of
requests is split to fit the API's limits (5,000 requests a batch, 10 MiB a call's body).
Routes and shapes: https://docs.runpod.io/serverless/advanced-workflows/batch-jobs"""
from __future__ import annotations

import json
from collections.abc import Iterator

from summarize.runner import FatalError

MAX_BATCH_REQUESTS = 5000  # requests one batch may hold
MAX_BODY_BYTES = 10 * 1024 * 1024  # the body of one add call
MAX_ACTIVE_BATCHES = 10  # batches of one endpoint that are not finished yet
PAGE_LIMIT = 100  # child requests asked per page of GET .../requests (the API may answer fewer)
TIMEOUT_S = 60.0  # one HTTP call; an add call's body is up to 10 MiB
DRAFT, FINALIZED, FAILED, CANCELLED = "DRAFT", "FINALIZED", "FAILED", "CANCELLED"
ENDED = (FAILED, CANCELLED)  # a batch's own end; one still FINALIZED may have finished all its requests
CHILD_FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
_ENVELOPE = len(b'{"requests":[]}')


class BatchCallError(RuntimeError):
    """A batch call that failed: `status` is its HTTP status (None: no answer came back)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        """Worth trying again later: no answer, a server error, or too many requests."""
        return self.status is None or self.status >= 500 or self.status == 429


def encoded(request: dict) -> bytes:
    """One child request (`{"input": ...}`) as it goes in an add call's body."""
    return json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def fits_one_call(request: dict) -> bool:
    """Whether one request alone fits an add call's body."""
    return _ENVELOPE + len(encoded(request)) <= MAX_BODY_BYTES


def batch_groups(items: list, max_requests: int | None = None) -> Iterator[list]:
    """`items` in runs of at most `max_requests` (a batch's limit), in order."""
    size = max_requests or MAX_BATCH_REQUESTS
    for start in range(0, len(items), size):
        yield items[start:start + size]


def add_bodies(requests: list[dict], max_bytes: int | None = None) -> Iterator[tuple[int, int, bytes]]:
    """(first, end, body) of successive add calls that carry `requests[first:end]`, each body at
    most `max_bytes`; a request too large for any call is the caller's to leave out first."""
    limit = max_bytes or MAX_BODY_BYTES
    first, parts, size = 0, [], _ENVELOPE
    for n, request in enumerate(requests):
        part = encoded(request)
        extra = len(part) + (1 if parts else 0)  # the comma between two requests
        if parts and size + extra > limit:
            yield first, n, _body(parts)
            first, parts, size = n, [], _ENVELOPE
            extra = len(part)
        if _ENVELOPE + len(part) > limit:
            raise ValueError(f"request {n} is {len(part)} bytes: past one call's {limit}")
        parts.append(part)
        size += extra
    if parts:
        yield first, len(requests), _body(parts)


def _body(parts: list[bytes]) -> bytes:
    return b'{"requests":[' + b",".join(parts) + b"]}"


class BatchAPI:
    """Blocking calls to one endpoint's batch routes (run them off the event loop)."""

    def __init__(self, base_url: str, endpoint_id: str, api_key: str):
        import requests  # a dependency of the runpod package, which endpoint mode needs

        self.base = f"{base_url.rstrip('/')}/{endpoint_id}/batch"
        self.endpoint_id = endpoint_id
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
        self._requests = requests

    def create(self) -> str:
        """A new, empty DRAFT batch's id. Requests go in with `add`, whose answer names them
        (the answer to a create call with requests in it does not)."""
        answer = self._call("POST", "", b"[]")
        if not isinstance(answer, dict) or not isinstance(answer.get("id"), str):
            raise BatchCallError(f"POST /batch answered no batch id: {_short(answer)}", 200)
        return answer["id"]

    def add(self, batch_id: str, body: bytes, count: int) -> list[str]:
        """Add the `count` requests of `body` to a DRAFT batch; their ids, in the order sent."""
        answer = self._call("POST", f"/{batch_id}/requests", body)
        items = answer.get("requests") if isinstance(answer, dict) else None
        ids = [i.get("id") if isinstance(i, dict) else i for i in items] if isinstance(items, list) else []
        if len(ids) != count or not all(isinstance(i, str) and i for i in ids):
            raise FatalError(f"{self.base}/{batch_id}/requests answered {len(ids)} request ids for {count} requests "
                             f"added ({_short(answer)}): the results could not be told apart; use the endpoint "
                             "without --batch")
        return ids

    def finalize(self, batch_id: str) -> None:
        self._call("POST", f"/{batch_id}/finalize", b"")

    def cancel(self, batch_id: str) -> None:
        self._call("POST", f"/{batch_id}/cancel", b"")

    def delete(self, batch_id: str, request_id: str) -> None:
        """Take one request out of a DRAFT batch."""
        self._call("DELETE", f"/{batch_id}/requests/{request_id}", None)

    def summary(self, batch_id: str) -> dict:
        """`{"id", "status", "requestTotal", "requestInProgress", "requestCompleted", "requestFailed", ...}`"""
        answer = self._call("GET", f"/{batch_id}", None)
        if not isinstance(answer, dict) or not isinstance(answer.get("status"), str):
            raise BatchCallError(f"GET /batch/{batch_id} answered no status: {_short(answer)}", 200)
        return answer

    def children(self, batch_id: str) -> Iterator[dict]:
        """Every child request `{"id", "status", "output" | "error", ...}`, page by page, in
        the API's order (unspecified)."""
        offset = 0
        while True:
            answer = self._call("GET", f"/{batch_id}/requests?offset={offset}&limit={PAGE_LIMIT}", None)
            page = answer.get("requests") if isinstance(answer, dict) else None
            if not isinstance(page, list):
                raise BatchCallError(f"GET /batch/{batch_id}/requests answered no requests: {_short(answer)}", 200)
            yield from (c for c in page if isinstance(c, dict) and isinstance(c.get("id"), str))
            offset += len(page)
            if not answer.get("hasMore") or not page:
                return

    def _call(self, method: str, path: str, body: bytes | None):
        """The JSON answer; FatalError for a refused key or an endpoint without batch routes,
        BatchCallError for any other failure."""
        url = self.base + path
        try:
            reply = self.session.request(method, url, data=body, timeout=TIMEOUT_S)
        except self._requests.RequestException as exc:
            raise BatchCallError(f"{method} {url}: {type(exc).__name__}: {exc}") from None
        if reply.status_code == 401:
            raise FatalError(f"{url}: the API key was refused (401); check RUNPOD_API_KEY")
        if reply.status_code == 404 and not path:  # POST /batch itself: no such endpoint, or no batch jobs
            raise FatalError(f"{url}: not found (404): no endpoint {self.endpoint_id} with batch jobs there")
        if reply.status_code >= 400:
            raise BatchCallError(f"{method} {url}: {reply.status_code} {_short(reply.text)}", reply.status_code)
        try:
            return reply.json() if reply.content else {}
        except ValueError:
            raise BatchCallError(f"{method} {url}: the answer is not JSON: {_short(reply.text)}", reply.status_code) \
                from None


def _short(value, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:limit]
