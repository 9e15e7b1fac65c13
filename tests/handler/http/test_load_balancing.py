"""A RunPod load-balancing endpoint's worker (handler.http.lb_server) on the tiny model, served on
free ports of 127.0.0.1 and spoken to over HTTP: /ping answers 204 while the model loads, then
200; the OpenAI routes under /v1 (whole and streamed) and POST /runsync; 429 with Retry-After
past the worker's concurrency; coded errors naming the field; LB_REQUEST_TIMEOUT_S ending a long
request `timeout`; a failed load; and `python -m handler --load-balancing` draining on SIGTERM."""
from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import ClientSession

from tests.handler.conftest import settings_for
from tests.handler.http.test_openai import CHAT, check_chat_completion, check_chunk, events

LONG = {"model": "any", "messages": [{"role": "user", "content": "Count"}], "max_tokens": 200, "ignore_eos": True}


class Client:
    """Requests to the served worker: (status, headers, parsed JSON body or raw text)."""

    def __init__(self, session: ClientSession, base: str):
        self.session, self.base = session, base

    async def call(self, method: str, path: str, body=None, raw: bytes | None = None):
        kw = {"data": raw} if raw is not None else {"json": body}
        async with self.session.request(method, self.base + path, **kw) as resp:
            text = await resp.text()
            is_json = resp.headers.get("Content-Type", "").startswith("application/json")
            return resp.status, resp.headers, json.loads(text) if is_json else text


def gated_factory(gate: threading.Event):
    """The real engine load, which first waits for `gate` (a load that takes as long as the test wants)."""
    from handler.engine_setup import build_engine

    def factory(settings, on_stage):
        assert gate.wait(60), "the test never released the load"
        return build_engine(settings, on_stage)

    return factory


def start_server(loop, settings, factory=None):
    from handler.http.lb_server import BalancedServer
    from handler.worker import Worker

    worker = Worker(settings, engine_factory=factory) if factory else Worker(settings)
    server = BalancedServer(worker, "127.0.0.1", 0)
    loop.run_until_complete(server.start())
    host, port = server.addresses[0]
    return server, f"http://{host}:{port}"


@pytest.fixture(scope="module")
def lb(tiny_llama_dir, loop):
    """(server, base URL, the /ping answers seen while the load waited and after it) of a worker of
    MAX_CONCURRENCY 2 whose load waited for the test to release it."""
    gate = threading.Event()
    server, base = start_server(loop, settings_for(tiny_llama_dir, MAX_CONCURRENCY=2), gated_factory(gate))

    async def pings():
        async with ClientSession() as session:
            client = Client(session, base)
            seen = [(await client.call("GET", "/ping"))[0]]
            await asyncio.sleep(0.3)
            seen.append((await client.call("GET", "/ping"))[0])  # still loading
            gate.set()
            deadline = time.monotonic() + 60
            while seen[-1] != 200 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                seen.append((await client.call("GET", "/ping"))[0])
            return seen

    seen = loop.run_until_complete(pings())
    yield server, base, seen
    server.stop("the tests ended")
    loop.run_until_complete(server.run())


@pytest.fixture
def call(lb, loop):
    """`call(fn)`: run `await fn(Client)` on the loop that serves the worker."""
    _, base, _ = lb

    def run(fn, timeout: float = 120):
        async def main():
            async with ClientSession() as session:
                return await asyncio.wait_for(fn(Client(session, base)), timeout)
        return loop.run_until_complete(main())

    return run


@pytest.fixture
def slow_steps(lb, monkeypatch):
    """Every engine step of the served worker takes 30 ms longer (requests that are still running
    when the test acts)."""
    server = lb[0]
    llm = server.worker.engine.engine
    step = llm.step

    def slow():
        time.sleep(0.03)
        return step()

    monkeypatch.setattr(llm, "step", slow)
    return server


def test_ping_answers_204_while_the_model_loads_and_200_once_ready(lb):
    _, _, seen = lb
    assert seen[:2] == [204, 204], seen
    assert seen[-1] == 200 and set(seen) <= {204, 200}, seen


def test_chat_completion_whole_and_streamed(call):
    async def body(c):
        whole = await c.call("POST", "/v1/chat/completions", CHAT)
        streamed = await c.call("POST", "/v1/chat/completions",
                                {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
        models = await c.call("GET", "/v1/models")
        return whole, streamed, models

    (code, _, completion), (scode, headers, text), (mcode, _, models) = call(body)
    assert code == 200, completion
    assert check_chat_completion(completion).strip()
    assert completion["usage"]["completion_tokens"] > 0
    assert scode == 200 and headers["Content-Type"].startswith("text/event-stream"), text
    data = events(text)
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    chunks = [check_chunk(json.loads(d)) for d in data[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]).strip()
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    assert mcode == 200 and models["data"][0]["object"] == "model", models


def test_runsync_answers_the_jobs_result(call):
    async def body(c):
        return await c.call("POST", "/runsync", {"input": {"prompt": "The quick brown fox",
                                                           "sampling_params": {"max_tokens": 6, "ignore_eos": True}}})

    code, _, view = call(body)
    assert code == 200 and view["status"] == "COMPLETED", view
    assert "".join(i["text"] for i in view["output"]).strip() and view["output"][-1]["finish_reason"] == "length"
    assert view["executionTime"] >= 0


def test_bad_requests_get_coded_errors_naming_the_field(call):
    async def body(c):
        return (await c.call("POST", "/v1/chat/completions", {**CHAT, "top_p": 1.5}),
                await c.call("POST", "/runsync", {"input": {"prompt": "Hi", "sampling_params": {"top_p": 1.5}}}),
                await c.call("POST", "/runsync", raw=b"{not json"),
                await c.call("POST", "/runsync", {"prompt": "no input"}),
                await c.call("GET", "/nowhere"))

    openai_bad, job_bad, not_json, no_input, unknown = call(body)
    code, _, answer = openai_bad
    assert code == 400 and answer["error"]["code"] == "invalid_input", answer
    assert answer["error"]["param"] == "openai_input.top_p" and answer["error"]["type"] == "invalid_request_error"
    code, _, view = job_bad
    assert code == 400 and view["status"] == "FAILED", view
    err = json.loads(view["error"])
    assert err["code"] == "invalid_input" and err["field"] == "sampling_params.top_p" and err["retryable"] is False
    for code, _, answer in (not_json, no_input):
        assert code == 400 and answer["error"]["code"] == "invalid_input" and answer["error"]["param"] == "body"
    assert "not JSON" in not_json[2]["error"]["message"] and '"input"' in no_input[2]["error"]["message"]
    code, _, answer = unknown
    assert code == 404 and answer["error"]["code"] == "invalid_input" and "/nowhere" in answer["error"]["message"]


def test_bodies_up_to_runpods_30_mb_are_read_and_larger_ones_get_a_coded_413(call):
    """RunPod's load balancer passes up to 30 MB: a 25 MB body is read (and then judged on its
    content), a 31 MB one is refused 413, coded, naming the body."""
    def padded(mb):  # a body of about mb MB: its text padded where nothing reads it
        return json.dumps({**CHAT, "max_tokens": 2, "user": "x" * (mb << 20)}).encode()

    async def body(c):
        return (await c.call("POST", "/v1/chat/completions", raw=padded(25)),
                await c.call("POST", "/v1/chat/completions", raw=padded(31)),
                await c.call("POST", "/runsync", raw=json.dumps({"input": {"prompt": "Hi", "sampling_params": {
                    "max_tokens": 2}}, "padding": "x" * (31 << 20)}).encode()))

    read, chat_big, job_big = call(body)
    assert read[0] != 413, read[2]
    for code, _, answer in (chat_big, job_big):
        assert code == 413 and answer["error"]["code"] == "invalid_input" and answer["error"]["param"] == "body", answer
        assert "30 MB" in answer["error"]["message"]


def test_requests_past_the_concurrency_get_429_with_retry_after(call, slow_steps):
    server = slow_steps

    async def body(c):
        running = [asyncio.ensure_future(c.call("POST", "/v1/chat/completions", {**LONG, "max_tokens": 40}))
                   for _ in range(2)]
        deadline = time.monotonic() + 30
        while server.endpoint.running < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        refused = await c.call("POST", "/v1/chat/completions", CHAT)
        job_refused = await c.call("POST", "/runsync", {"input": {"prompt": "Hi"}})
        models = await c.call("GET", "/v1/models")  # no slot needed
        return refused, job_refused, models, await asyncio.gather(*running)

    refused, job_refused, models, done = call(body)
    for code, headers, answer in (refused, job_refused):
        assert code == 429 and headers["Retry-After"] == "1", answer
        err = answer["error"]
        assert err["code"] == "overloaded" and err["retryable"] is True and "MAX_CONCURRENCY=2" in err["message"]
    assert models[0] == 200
    assert [code for code, _, _ in done] == [200, 200], done
    assert server.endpoint.running == 0 and server.endpoint.tasks == {}


def test_lb_request_timeout_cuts_a_long_request_with_the_coded_timeout(call, slow_steps, monkeypatch):
    monkeypatch.setattr(slow_steps.endpoint, "timeout_s", 0.6)

    async def body(c):
        return (await c.call("POST", "/v1/chat/completions", LONG),
                await c.call("POST", "/v1/chat/completions", {**LONG, "stream": True}),
                await c.call("POST", "/runsync", {"input": {"prompt": "Count", "timeout_s": 100, "sampling_params": {
                    "max_tokens": 200, "ignore_eos": True}}}))

    whole, streamed, job = call(body)
    code, _, answer = whole
    assert code == 504 and answer["error"]["code"] == "timeout" and answer["error"]["retryable"] is True, answer
    assert answer["error"]["partial_text"]  # the text so far comes with it
    code, _, text = streamed
    data = events(text)
    assert code == 200 and data[-1] == "[DONE]", text
    last = json.loads(data[-2])
    assert last["error"]["code"] == "timeout" and last["error"]["timeout_s"] == 0.6, last
    assert any("choices" in json.loads(d) for d in data[:-2])  # text came before the cut
    code, _, view = job
    assert code == 504 and view["status"] == "FAILED" and json.loads(view["error"])["code"] == "timeout", view


def test_a_model_that_cannot_load_makes_ping_unhealthy_and_the_worker_exit_1(tmp_path, loop):
    from engine.errors import ModelLoadError
    from handler.http.lb_app import ping_status

    def broken(settings, on_stage):
        raise ModelLoadError("config.json: unreadable (made so by the test)")

    server, _ = start_server(loop, settings_for(str(tmp_path)), broken)
    assert loop.run_until_complete(asyncio.wait_for(server.run(), 30)) == 1
    assert ping_status(server.endpoint) == 503


def hanging_endpoint(tiny_llama_dir, monkeypatch, **env):
    """A BalancedEndpoint whose worker's handler never ends (nor heeds its deadline), GRACE_S 0.1."""
    from handler.http import lb_endpoint
    from handler.worker import Worker

    async def hang(job):
        await asyncio.Event().wait()
        yield "never"

    monkeypatch.setattr(lb_endpoint, "GRACE_S", 0.1)
    worker = Worker(settings_for(tiny_llama_dir, **env))
    worker.handle = hang
    return lb_endpoint.BalancedEndpoint(worker)


def test_a_request_past_its_deadline_that_does_not_end_is_ended_timeout_by_the_backstop(tiny_llama_dir, loop,
                                                                                       monkeypatch):
    endpoint = hanging_endpoint(tiny_llama_dir, monkeypatch, LB_REQUEST_TIMEOUT_S="0.2")

    async def body():
        job = endpoint.submit({"prompt": "Hi"})
        assert job.input["timeout_s"] == 0.2  # the worker's own deadline, which this handler ignores
        await asyncio.wait_for(endpoint.wait_final(job), 10)
        await asyncio.sleep(0.05)
        return job

    job = loop.run_until_complete(body())
    err = json.loads(job.error)
    assert job.status == "FAILED" and err["code"] == "timeout" and "LB_REQUEST_TIMEOUT_S=0.2" in err["message"]
    assert endpoint.tasks == {} and endpoint.running == 0


def test_the_drain_ends_requests_still_running_at_its_deadline_worker_shutdown(tiny_llama_dir, loop, monkeypatch):
    from handler.http.lb_endpoint import Refused

    endpoint = hanging_endpoint(tiny_llama_dir, monkeypatch, DRAIN_TIMEOUT_S="0.2")

    async def body():
        job = endpoint.submit({"prompt": "Hi"})
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await endpoint.drain("SIGTERM")
        with pytest.raises(Refused) as refused:
            endpoint.submit({"prompt": "Hi"})
        await asyncio.sleep(0.05)
        return job, time.monotonic() - t0, refused.value

    job, took, refused = loop.run_until_complete(body())
    assert job.status == "FAILED" and json.loads(job.error)["code"] == "worker_shutdown", job.view()
    assert took < 2 and endpoint.tasks == {}
    assert refused.status == 503 and refused.error.code == "worker_shutdown"


# -- the command line: python -m handler --load-balancing, SIGTERM -----------------------------


def request(url: str, body=None) -> tuple[int, dict | None]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_sigterm_refuses_new_requests_and_finishes_the_running_one(tiny_llama_dir):
    from tests.fakes.worker_process import WorkerProcess
    from tests.handler.test_local import free_port, local_env

    port, health = free_port(), free_port()
    env = local_env(MODEL_NAME=tiny_llama_dir, LOAD_BALANCING="true", PORT=str(port), PORT_HEALTH=str(health))
    proc = WorkerProcess(env, ["--host", "127.0.0.1"], step_delay_s=0.05)
    try:
        proc.wait_for_port(health, 60)
        deadline = time.monotonic() + 60
        while request(f"http://127.0.0.1:{health}/ping")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert request(f"http://127.0.0.1:{port}/ping")[0] == 404  # /ping has its own port here
        result = {}
        running = threading.Thread(target=lambda: result.update(r=request(
            f"http://127.0.0.1:{port}/runsync", {"input": {"prompt": "Count", "sampling_params": {
                "max_tokens": 30, "ignore_eos": True}}})))
        running.start()
        time.sleep(0.5)  # running: 30 steps of 50 ms at least
        proc.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = request(f"http://127.0.0.1:{port}/v1/chat/completions", CHAT)
        ping = request(f"http://127.0.0.1:{health}/ping")
        running.join(60)
        rc = proc.wait(30)
    finally:
        proc.stop()
    assert refused[0] == 503 and refused[1]["error"]["code"] == "worker_shutdown", refused
    assert ping[0] == 503, ping
    code, view = result["r"]
    assert code == 200 and view["status"] == "COMPLETED" and view["output"][-1]["finish_reason"] == "length", view
    assert rc == 0, proc.output[-3000:]
