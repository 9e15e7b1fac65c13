"""`summarize --endpoint ID --batch` against a fake of RunPod's batch jobs API whose children run
on the project's handler: a folder in one batch, a failed child reported with its code, retries
in a new batch, the API's limits, and runs interrupted (Ctrl-C, or killed mid-add) that a rerun
finishes from the batches already made, submitting no document twice."""
from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

import pytest

from summarize import batch, batch_runner
from summarize.batch import BatchAPI
from summarize.batch_state import state_path
from summarize.store import ResultStore
from tests.fakes import runpod_batch_api as fake_batch
from tests.fakes.runpod_batch_api import FakeBatchAPI
from tests.summarize.conftest import fake_api_fixture, point_client_at
from tests.summarize.notes import (
    EXPECTED, KOREAN, SENTENCES, by_doc, check_line, make_notes, read_lines, summarize)


batch_api = fake_api_fixture(FakeBatchAPI)


@pytest.fixture
def batch_env(local_env, batch_api, monkeypatch):
    point_client_at(batch_api, monkeypatch)
    monkeypatch.setattr(batch_runner, "POLL_S", (0.02, 0.1))
    monkeypatch.setattr(batch_runner, "RETRY_COLLECT_S", 0.05)
    yield local_env
    batch_api.held, batch_api.names_added = False, True
    batch_api.max_requests, batch_api.max_body = fake_batch.MAX_REQUESTS, fake_batch.MAX_BODY
    assert not batch_api.violations


def run(api: FakeBatchAPI, *args: str) -> int:
    return summarize(*args, "--endpoint", api.endpoint, "--batch")


def made_since(api: FakeBatchAPI, before: set[str]) -> list:
    """The batches created since `before` (a set of batch ids), oldest first."""
    return sorted((b for i, b in api.batches.items() if i not in before), key=lambda b: b.created_ms)


def small_notes(root, n: int):
    folder = root / "many"
    folder.mkdir()
    rng = random.Random(n)
    for i in range(n):
        (folder / f"note-{i:02d}.txt").write_text(f"Note {i}. " + " ".join(rng.sample(SENTENCES, 2)), encoding="utf-8")
    return folder


def test_a_folder_goes_through_one_batch(batch_env, batch_api):
    make_notes(batch_env)
    before, calls, rest_calls = set(batch_api.batches), len(batch_api.batch_calls), len(batch_api.calls)
    assert run(batch_api, "notes", "--out", "r.jsonl") == 3  # only the empty and binary files failed

    lines = by_doc(read_lines(batch_env / "r.jsonl"))
    for doc, outcome in EXPECTED.items():
        check_line(lines[doc], outcome)
    (made,) = made_since(batch_api, before)
    children = batch_api.children(made.id)
    assert made.status == "FINALIZED" and [c["status"] for c in children.values()] == ["COMPLETED"] * 3
    texts = {lines[d]["job_id"]: d for d, o in EXPECTED.items() if o == "summary"}
    assert set(texts) == set(children)  # each child's result went to its own document
    assert batch_api.inputs[lines["notes/회의록.txt"]["job_id"]]["summarize"]["text"] == KOREAN
    assert lines["notes/archive/long.md"]["chunks"] > 1  # the worker's own output, parsed as /run's
    assert lines["notes/standup.md"]["gpu_seconds"] is not None  # from startedAt and completedAt
    calls = batch_api.batch_calls[calls:]
    assert calls.count(("POST", "create")) == 1 and calls.count(("POST", "add")) == 1
    assert calls.count(("POST", "finalize")) == 1 and ("GET", "summary") in calls and ("GET", "page") in calls
    assert ("POST", "run") not in batch_api.calls[rest_calls:] and ("GET", "health") in batch_api.calls[rest_calls:]
    assert not os.path.exists(state_path(str(batch_env / "r.jsonl")))  # nothing left to collect


def test_a_failed_child_is_reported_with_its_code_and_the_others_complete(batch_env, batch_api, capsys):
    make_notes(batch_env)
    before = set(batch_api.batches)
    batch_api.fail_with_oom(lambda job_input: "Standup" in job_input["summarize"]["text"])
    rc = run(batch_api, "notes", "--out", "r.jsonl", "--report", "report.md", "--retries", "0")

    assert rc == 1  # a document failed and a rerun retries it
    lines = by_doc(read_lines(batch_env / "r.jsonl"))
    standup = lines["notes/standup.md"]
    assert standup["status"] == "failed" and standup["summary"] is None and standup["attempts"] == 1
    assert standup["error"]["code"] == "out_of_memory" and standup["error"]["retryable"] is True
    for doc in ("notes/회의록.txt", "notes/archive/long.md"):
        check_line(lines[doc], "summary")
    (made,) = made_since(batch_api, before)
    assert batch_api.children(made.id)[standup["job_id"]]["status"] == "FAILED"
    assert made.status == "FINALIZED"  # the batch itself did not fail
    assert "notes/standup.md: out_of_memory" in capsys.readouterr().out
    assert "**Failed** (out_of_memory)" in (batch_env / "report.md").read_text(encoding="utf-8")

    # a rerun retries that document alone, in a new batch, and keeps the others
    before = set(batch_api.batches)
    assert run(batch_api, "notes", "--out", "r.jsonl") == 3
    (again,) = made_since(batch_api, before)
    assert len(batch_api.children(again.id)) == 1
    rerun = by_doc(read_lines(batch_env / "r.jsonl"))
    check_line(rerun["notes/standup.md"], "summary")
    assert rerun["notes/회의록.txt"] == lines["notes/회의록.txt"]


def test_a_retryable_failure_is_retried_in_a_new_batch(batch_env, batch_api):
    make_notes(batch_env)
    before = set(batch_api.batches)
    batch_api.fail_with_oom(lambda job_input: job_input["summarize"]["text"] == KOREAN)
    assert run(batch_api, "notes/standup.md", "notes/회의록.txt", "--out", "r.jsonl") == 0
    korean = by_doc(read_lines(batch_env / "r.jsonl"))["notes/회의록.txt"]
    check_line(korean, "summary")
    assert korean["attempts"] == 2 and korean["retried_after"] == ["out_of_memory"]
    first, second = made_since(batch_api, before)
    assert len(batch_api.children(first.id)) == 2 and list(batch_api.children(second.id)) == [korean["job_id"]]


def test_the_limits_split_batches_and_add_calls(batch_env, batch_api, monkeypatch):
    """Past a batch's requests and a call's bytes (shrunk here, on both sides), more batches and
    more add calls; the fake refuses anything past them, and pages its lists by 100 at most."""
    small_notes(batch_env, 7)
    monkeypatch.setattr(batch, "MAX_BATCH_REQUESTS", 3)
    monkeypatch.setattr(batch, "MAX_BODY_BYTES", 1500)
    monkeypatch.setattr(batch, "PAGE_LIMIT", 2)
    batch_api.max_requests, batch_api.max_body = 3, 1500
    before, calls = set(batch_api.batches), len(batch_api.batch_calls)
    assert run(batch_api, "many", "--out", "r.jsonl") == 0

    lines = by_doc(read_lines(batch_env / "r.jsonl"))
    assert len(lines) == 7 and all(line["status"] in ("ok", "truncated") for line in lines.values())
    made = made_since(batch_api, before)
    assert [len(b.inputs) for b in made] == [3, 3, 1]
    assert {line["job_id"] for line in lines.values()} == {c for b in made for c in b.inputs}
    adds = batch_api.batch_calls[calls:].count(("POST", "add"))
    assert adds > len(made)  # 1,500 bytes hold two of these requests, not three


def test_the_split_keeps_every_request_in_order_within_the_limits():
    """The real limits: 5,000 requests a batch, 10 MiB an add call's body."""
    requests = [{"input": {"summarize": {"text": str(n)}}} for n in range(12_001)]
    assert [len(g) for g in batch.batch_groups(requests)] == [5000, 5000, 2001]
    assert [r for g in batch.batch_groups(requests) for r in g] == requests
    large = [{"input": {"summarize": {"text": "회의록" * (n % 5 * 30_000 + 1)}}} for n in range(40)]  # 21 MiB
    bodies = list(batch.add_bodies(large))
    assert len(bodies) == 3 and all(len(body) <= 10 * 1024 * 1024 for _, _, body in bodies)
    for (_, end, body) in bodies[:-1]:  # each call as full as the limit allows
        assert len(body) + 1 + len(batch.encoded(large[end])) > 10 * 1024 * 1024
    assert [r for first, end, _ in bodies for r in large[first:end]] == large
    assert [r for _, _, body in bodies for r in json.loads(body)["requests"]] == large
    assert batch.fits_one_call(large[4]) and not batch.fits_one_call({"input": {"text": "x" * (10 * 1024 * 1024)}})


def test_ctrl_c_leaves_the_batch_running_and_a_rerun_collects_it(batch_env, batch_api, monkeypatch, capsys,
                                                                 terminal_sigint):
    small_notes(batch_env, 4)
    before = set(batch_api.batches)
    real_append = ResultStore.append

    def append_then_ctrl_c(self, line):  # the first result written, then Ctrl-C
        real_append(self, line)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(ResultStore, "append", append_then_ctrl_c)
    assert run(batch_api, "many", "--out", "r.jsonl") == 130
    (made,) = made_since(batch_api, before)
    assert made.status == "FINALIZED" and len(made.inputs) == 4  # not cancelled: it runs on
    assert f"batches left on the endpoint: {made.id}" in capsys.readouterr().out
    assert made.id in (batch_env / "r.jsonl.batches").read_text(encoding="utf-8")
    done = by_doc(read_lines(batch_env / "r.jsonl"))
    assert len(done) == 1

    monkeypatch.setattr(ResultStore, "append", real_append)
    calls = len(batch_api.batch_calls)
    assert run(batch_api, "many", "--out", "r.jsonl") == 0
    assert made_since(batch_api, before) == [made]  # no new batch
    new_calls = batch_api.batch_calls[calls:]
    assert not {("POST", "create"), ("POST", "add"), ("POST", "finalize")} & set(new_calls)  # nothing submitted
    final = by_doc(read_lines(batch_env / "r.jsonl"))
    assert len(final) == 4 and {line["job_id"] for line in final.values()} == set(made.inputs)
    for doc, line in done.items():
        assert final[doc] == line  # the finished one kept as it was
    assert not (batch_env / "r.jsonl.batches").exists()


def test_a_run_killed_after_an_add_call_reached_the_api_is_finished_in_the_same_batch(
        batch_env, batch_api, monkeypatch, capsys, terminal_sigint):
    """The add call went through but its answer (the request ids) was never recorded: the rerun
    takes the unknown requests out of the draft, adds the documents again, finalizes that batch."""
    small_notes(batch_env, 3)
    before = set(batch_api.batches)
    real_add, gone = BatchAPI.add, threading.Event()

    def add_then_die(self, batch_id, body, count):
        real_add(self, batch_id, body, count)
        os.kill(os.getpid(), signal.SIGINT)  # the run ends while the answer is on its way back
        gone.wait(30)
        raise ConnectionError("the answer never arrived")

    monkeypatch.setattr(BatchAPI, "add", add_then_die)
    try:
        assert run(batch_api, "many", "--out", "r.jsonl") == 130
    finally:
        gone.set()
    (made,) = made_since(batch_api, before)
    assert f"batches left on the endpoint: {made.id}" in capsys.readouterr().out
    orphans = set(made.inputs)
    assert made.status == "DRAFT" and len(orphans) == 3 and read_lines(batch_env / "r.jsonl") == []

    monkeypatch.setattr(BatchAPI, "add", real_add)
    calls = len(batch_api.batch_calls)
    assert run(batch_api, "many", "--out", "r.jsonl") == 0
    assert made_since(batch_api, before) == [made]  # the same batch id, picked up from r.jsonl.batches
    new_calls = batch_api.batch_calls[calls:]
    assert ("POST", "create") not in new_calls and new_calls.count(("DELETE", "delete")) == 3
    assert made.status == "FINALIZED" and len(made.inputs) == 3 and not orphans & set(made.inputs)
    lines = by_doc(read_lines(batch_env / "r.jsonl"))
    assert len(lines) == 3 and {line["job_id"] for line in lines.values()} == set(made.inputs)


def test_a_failed_batch_fails_what_it_did_not_finish_and_they_are_retried(batch_env, batch_api):
    small_notes(batch_env, 2)
    before = set(batch_api.batches)
    batch_api.held = True  # the children wait IN_QUEUE until the batch fails

    def fail_when_finalized():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            made = made_since(batch_api, before)
            if made and made[0].status == "FINALIZED":
                batch_api.fail_batch(made[0].id)
                batch_api.held = False
                return
            time.sleep(0.01)

    threading.Thread(target=fail_when_finalized, daemon=True).start()
    assert run(batch_api, "many", "--out", "r.jsonl") == 0
    first, second = made_since(batch_api, before)
    assert first.status == "FAILED" and len(second.inputs) == 2
    for line in read_lines(batch_env / "r.jsonl"):
        assert line["retried_after"] == ["batch_failed"] and line["job_id"] in second.inputs


def test_an_api_that_does_not_name_the_added_requests_stops_the_run(batch_env, batch_api, capsys):
    """Without the ids there is no telling which result is whose: the run stops, nothing guessed."""
    small_notes(batch_env, 2)
    before = set(batch_api.batches)
    batch_api.names_added = False
    assert run(batch_api, "many", "--out", "r.jsonl") == 2
    assert "2 requests added" in capsys.readouterr().err and read_lines(batch_env / "r.jsonl") == []
    (made,) = made_since(batch_api, before)
    assert made.status == "CANCELLED"  # given up, not left as a draft


@pytest.mark.parametrize("flags, named", [
    ((), "--endpoint"),
    (("--endpoint", "ep", "--fallback-endpoint", "other"), "--fallback-endpoint"),
    (("--endpoint", "ep", "--concurrency", "4"), "--concurrency"),
    (("--endpoint", "ep", "--job-timeout", "60"), "--job-timeout"),
])
def test_flags_that_do_not_go_with_batch_are_refused_by_name(local_env, capsys, flags, named):
    (local_env / "a.txt").write_text("Some text.", encoding="utf-8")
    assert summarize("a.txt", "--out", "r.jsonl", "--batch", *flags) == 2
    err = capsys.readouterr().err
    assert "error: invalid_flag: " in err and named in err and "--batch" in err
    assert not (local_env / "r.jsonl").exists()


def test_the_fake_serves_the_documented_routes_and_limits(batch_api):
    """The fake as RunPod's docs describe the API: a DRAFT runs nothing until finalized; add
    calls past 10 MiB or 5,000 requests are refused; the list pages with hasMore; a failed child
    (the worker's own error) leaves its batch FINALIZED; a cancelled batch cancels its queue."""
    import requests

    api = BatchAPI(batch_api.base_url, batch_api.endpoint, batch_api.api_key)
    url, auth = f"{batch_api.base_url}/{batch_api.endpoint}/batch", {"Authorization": f"Bearer {batch_api.api_key}"}
    prompt = {"prompt": "hi", "sampling_params": {"max_tokens": 2}}
    draft = requests.post(url, json=[{"input": prompt}], headers=auth, timeout=10).json()
    assert draft["status"] == "DRAFT" and set(draft) == {"id", "status"}  # no request ids: as documented
    body = json.dumps({"requests": [{"input": prompt}] * 4 + [{"input": {"prompt": "hi", "n": 0}}]}).encode()
    ids = api.add(draft["id"], body, 5)
    time.sleep(0.2)
    assert api.summary(draft["id"])["requestCompleted"] == 0  # a DRAFT runs nothing
    big = requests.post(f"{url}/{draft['id']}/requests", data=b" " * (10 * 1024 * 1024 + 1), headers=auth, timeout=10)
    many = requests.post(f"{url}/{draft['id']}/requests", json={"requests": [{"input": prompt}] * 4995},
                         headers=auth, timeout=10)
    assert big.status_code == 413 and many.status_code == 400 and "5000" in many.json()["error"]

    api.finalize(draft["id"])
    deadline = time.monotonic() + 30
    while (s := api.summary(draft["id"]))["requestCompleted"] + s["requestFailed"] < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s["status"] == "FINALIZED" and (s["requestTotal"], s["requestCompleted"], s["requestFailed"]) == (6, 5, 1)
    page = requests.get(f"{url}/{draft['id']}/requests?offset=0&limit=4", headers=auth, timeout=10).json()
    assert len(page["requests"]) == 4 and page["hasMore"] is True and page["total"] == 6
    children = list(api.children(draft["id"]))
    assert {c["id"] for c in children} >= set(ids) and len(children) == 6
    assert {c["status"] for c in children} == {"COMPLETED", "FAILED"}
    failed_child = next(c for c in children if c["status"] == "FAILED")
    assert json.loads(failed_child["error"])["code"] == "invalid_input" and failed_child["id"] in ids

    batch_api.held = True
    try:
        queued = api.create()
        api.add(queued, json.dumps({"requests": [{"input": prompt}]}).encode(), 1)
        api.finalize(queued)
        api.cancel(queued)
        assert api.summary(queued)["status"] == "CANCELLED"
        assert [c["status"] for c in api.children(queued)] == ["CANCELLED"]
    finally:
        batch_api.held = False
    assert not batch_api.violations
