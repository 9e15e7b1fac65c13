"""Runs the built worker image against the fake RunPod control plane from the tests
(tests/fakes/runpod_control_plane.py) and checks every job's ending (scripts/build_image.sh
runs it; not part of the image):

    python docker/run_image_jobs.py IMAGE [--tests .runpod/tests.json]

`docker run --network host` with RUNPOD_WEBHOOK_* pointed at the fake on 127.0.0.1, then:
a streamed chat job (timed from `docker run` to its first streamed token: the cold start,
the model baked), the README's summarize job (examples/summarize_job.json), an OpenAI route
job, `prompt_too_long`, `truncated` with `on_truncation: "error"`, every job of tests.json
(what the Hub runs), and `docker stop` while two long jobs run: each must end COMPLETED
or FAILED with a coded error, none lost. Then `docker run --network none` (no network at
all): the baked model loads and answers a job given by --test_input; the load-balancing mode
(LOAD_BALANCING=true): /ping 204 then 200, a chat completion, 0 on `docker stop`; and a
RunPod cached model (a tiny random Llama in a lowercased `models--org--name` folder mounted
at /runpod-volume/huggingface-cache/hub) loaded offline and served under its name. Prints
each job's status; exits 1 when any ending is not the expected one.
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fakes.runpod_control_plane import FINAL, FakeControlPlane  # noqa: E402

ENV = {"MAX_MODEL_LEN": "2048", "METRICS_LOG_INTERVAL_S": "0"}
GREEDY = {"temperature": 0}


def _jobs(tests_json: Path) -> list[tuple[str, dict, str]]:
    """(name, input, expected ending: COMPLETED or a FAILED code)."""
    readme_job = json.loads((REPO / "examples" / "summarize_job.json").read_text(encoding="utf-8"))["input"]
    jobs = [
        ("chat_stream (first token)", {"messages": [{"role": "user", "content": "Name three colours."}],
                                       "stream": True, "sampling_params": {"max_tokens": 32, **GREEDY}}, "COMPLETED"),
        ("README summarize job", readme_job, "COMPLETED"),
        ("openai /v1/chat/completions", {"openai_route": "/v1/chat/completions", "openai_input": {
            "model": "SmolLM2-135M-Instruct-AWQ", "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 24, "stream": True, **GREEDY}}, "COMPLETED"),
        ("prompt_too_long", {"prompt": "word " * 4000, "sampling_params": {"max_tokens": 8}}, "prompt_too_long"),
        ("truncated (on_truncation error)", {"prompt": "Count from one to one hundred: one, two,",
                                             "on_truncation": "error",
                                             "sampling_params": {"max_tokens": 4, "ignore_eos": True, **GREEDY}},
         "truncated"),
    ]
    for test in json.loads(tests_json.read_text(encoding="utf-8"))["tests"]:
        jobs.append((f"tests.json {test['name']}", test["input"], "COMPLETED"))
    return jobs


def _ending(job) -> tuple[str, str]:
    """(COMPLETED | the FAILED code | the status, a short detail)."""
    if job.status == "COMPLETED":
        items = job.output if isinstance(job.output, list) else [job.output]
        last = items[-1] if items and isinstance(items[-1], dict) else {}
        text = "".join(i.get("text", "") for i in items if isinstance(i, dict) and isinstance(i.get("text"), str))
        detail = f"finish_reason {last.get('finish_reason')}, {len(text)} chars" if text else \
            f"{json.dumps(job.output)[:90]}"
        return "COMPLETED", detail
    if job.status == "FAILED":
        try:
            err = json.loads(job.error)
            return err.get("code", "FAILED"), str(err.get("message", ""))[:90]
        except (TypeError, json.JSONDecodeError):
            return "FAILED (no code)", str(job.error)[:90]
    return job.status, ""


def _docker(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True, **kw)


class _Alive:
    """Whether the container still runs, asked of docker at most every 2 s (a predicate of wait_for)."""

    def __init__(self, name: str):
        self.name, self.asked, self.running = name, 0.0, True

    def __call__(self) -> bool:
        if time.monotonic() - self.asked > 2:
            state = _docker("inspect", "-f", "{{.State.Running}}", self.name, check=False).stdout.strip()
            self.asked, self.running = time.monotonic(), state == "true"
        return self.running


def _run_container(fake: FakeControlPlane, image: str, name: str, env: dict[str, str]) -> float:
    _docker("rm", "-f", name, check=False)
    flags = [f for k, v in {**fake.worker_env(), **env}.items() for f in ("-e", f"{k}={v}")]
    started = time.monotonic()
    _docker("run", "-d", "--name", name, "--network", "host", *flags, image)
    return started


def _check(fake, expected: dict[str, tuple[str, str]]) -> int:
    bad = 0
    for jid, (name, want) in expected.items():
        got, detail = _ending(fake.jobs[jid])
        ok = got == want or (want == "FINAL" and fake.jobs[jid].status in FINAL and "no code" not in got)
        bad += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {name:44s} {got:18s} {detail}")
    return bad


def _stop_while_running(fake, name: str, timeout_s: float) -> tuple[dict, float]:
    """Two long jobs; `docker stop` once both stream: both must end, with a code if not COMPLETED."""
    long = {"prompt": "Write a long story about a lighthouse keeper.", "stream": True,
            "sampling_params": {"max_tokens": 1500, "ignore_eos": True, **GREEDY}}
    ids = {fake.submit(long, f"stop-{i}"): (f"docker stop while running #{i}", "FINAL") for i in (1, 2)}
    fake.wait_for(lambda: all(fake.jobs[j].stream for j in ids), timeout_s, "the two long jobs streaming")
    sent = time.monotonic()
    _docker("stop", "--time", "10", name)
    stop_s = time.monotonic() - sent
    fake.wait_for(lambda: fake.all_final(list(ids)), 5, "both jobs final after docker stop")
    return ids, stop_s


def _offline_job(image: str, timeout_s: float) -> int:
    """The container with no network at all answers a job (local mode: there is no control
    plane to reach); the count of failures (0 or 1)."""
    job = {"input": {"prompt": "Meeting notes: the budget moved to May.",
                     "sampling_params": {"max_tokens": 8, "ignore_eos": True, **GREEDY}}}
    try:
        r = _docker("run", "--rm", "--network", "none", image, "sh", "/opt/worker/start.sh", "--test_input",
                    json.dumps(job), check=False, timeout=timeout_s)
        ok, detail = r.returncode == 0 and '"COMPLETED"' in r.stdout, f"exit {r.returncode}"
    except subprocess.TimeoutExpired:
        ok, r, detail = False, None, f"no answer in {timeout_s:.0f}s"
    print(f"  {'ok  ' if ok else 'FAIL'} {'docker run --network none, one job':44s} {detail}")
    if not ok and r is not None:
        print("image_jobs: its output (tail):\n" + (r.stdout + r.stderr)[-3000:])
    return 0 if ok else 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict | None]:
    """(status, JSON body or None); (0, None) when nothing answers yet."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, None
    except OSError:
        return 0, None


def _balanced(image: str, name: str, label: str, env: dict[str, str], checks, timeout_s: float,
              volumes: tuple[str, ...] = ()) -> int:
    """A load-balancing container on the host network: /ping answers 204 (loading) or 503 until
    200, then `checks(base)` returns (ok, detail); `docker stop` must end it with status 0."""
    port = _free_port()
    _docker("rm", "-f", name, check=False)
    flags = [f for k, v in {**ENV, **env, "LOAD_BALANCING": "true", "PORT": str(port)}.items()
             for f in ("-e", f"{k}={v}")]
    _docker("run", "-d", "--name", name, "--network", "host", *[f for v in volumes for f in ("-v", v)], *flags, image)
    base, seen, ok, detail = f"http://127.0.0.1:{port}", [], False, ""
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = _http("GET", f"{base}/ping", timeout=5)[0]
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == 200 or status not in (0, 204):
                break
            time.sleep(0.2)
        if seen[-1] == 200:
            ok, detail = checks(base)
        else:
            detail = f"/ping answered {seen}"
        _docker("stop", "--time", "10", name)
        code = _docker("inspect", "-f", "{{.State.ExitCode}}", name, check=False).stdout.strip()
        ok = ok and code == "0"
        detail = f"/ping {seen}, exit {code}; {detail}"
    finally:
        if not ok:
            logs = _docker("logs", "--tail", "25", name, check=False)
            print("image_jobs: the container's log (tail):\n" + logs.stdout + logs.stderr)
        _docker("rm", "-f", name, check=False)
    print(f"  {'ok  ' if ok else 'FAIL'} {label:44s} {detail[:120]}")
    return 0 if ok else 1


def _chat(base: str) -> tuple[bool, str]:
    status, body = _http("POST", f"{base}/v1/chat/completions", {
        "model": "any", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    text = (body or {}).get("choices", [{}])[0].get("message", {}).get("content") or ""
    return status == 200 and bool(text.strip()), f"chat {status}: {text[:40]!r}"


def _cached_model(image: str, name: str, timeout_s: float) -> int:
    """A tiny random Llama as RunPod caches a model (lowercased folder, refs/main), mounted
    read-only where RunPod mounts it; served under MODEL_NAME as written, offline."""
    from tests.fakes.hub_cache import lay_out
    from tests.models import make_checkpoint

    served = "Org/Tiny-Llama"
    with tempfile.TemporaryDirectory(prefix="hub-cache-") as tmp:
        src = make_checkpoint(str(Path(tmp) / "src"))
        hub = Path(tmp) / "hub"
        lay_out(hub, "models--org--tiny-llama", src, {"c" * 40: time.time()}, {"main": "c" * 40})

        def checks(base: str) -> tuple[bool, str]:
            status, body = _http("GET", f"{base}/v1/models")
            ids = [m.get("id") for m in (body or {}).get("data", [])]
            job = {"input": {"prompt": "Meeting notes:", "sampling_params": {"max_tokens": 4, "ignore_eos": True}}}
            run_status, result = _http("POST", f"{base}/runsync", job)
            done = (result or {}).get("status")
            return status == 200 and ids == [served] and done == "COMPLETED", f"models {ids}, runsync {done}"

        return _balanced(image, name, "cached model, load-balancing mode", {
            "MODEL_NAME": served, "MAX_MODEL_LEN": "256", "EMPTY_OUTPUT_RETRIES": "8"}, checks, timeout_s,
            volumes=(f"{hub}:/runpod-volume/huggingface-cache/hub:ro",))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="run_image_jobs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("image")
    p.add_argument("--tests", type=Path, default=REPO / ".runpod" / "tests.json")
    p.add_argument("--name", default="runpod-llm-worker-jobs")
    p.add_argument("--timeout", type=float, default=600, help="seconds for the jobs to end")
    args = p.parse_args(argv)
    tests_env = {e["key"]: e["value"] for e in json.loads(args.tests.read_text())["config"].get("env", [])}
    fake = FakeControlPlane().start()
    bad = 0
    try:
        jobs = _jobs(args.tests)
        first = fake.submit(jobs[0][1])
        started = _run_container(fake, args.image, args.name, {**ENV, **tests_env})
        alive = _Alive(args.name)
        fake.wait_for(lambda: fake.jobs[first].stream or fake.jobs[first].status in FINAL or not alive(),
                      args.timeout, "the first streamed token")
        if not alive():
            raise RuntimeError("the container exited before its first job streamed a token")
        cold = time.monotonic() - started
        expected = {first: (jobs[0][0], jobs[0][2])}
        expected |= {fake.submit(job): (name, want) for name, job, want in jobs[1:]}
        fake.wait_for(lambda: fake.all_final(list(expected)) or not alive(), args.timeout, "every job ending")
        print(f"image_jobs: cold start, docker run to the first streamed token: {cold:.1f}s (model baked)")
        bad += _check(fake, expected)
        stopped, stop_s = _stop_while_running(fake, args.name, args.timeout)
        print(f"image_jobs: docker stop returned after {stop_s:.1f}s")
        bad += _check(fake, stopped)
        if fake.violations:
            print(f"image_jobs: protocol violations: {fake.violations[:5]}")
            bad += 1
    except Exception as exc:  # noqa: BLE001  (a timeout: report it with the container's log)
        print(f"image_jobs: FAILED: {exc}")
        bad += 1
    finally:
        fake.stop()
        logs = _docker("logs", "--tail", "25", args.name, check=False)
        if bad:
            print("image_jobs: the container's log (tail):\n" + logs.stdout + logs.stderr)
        _docker("rm", "-f", args.name, check=False)
    bad += _offline_job(args.image, args.timeout)
    bad += _balanced(args.image, args.name, "load-balancing mode, chat completion", {}, _chat, args.timeout)
    bad += _cached_model(args.image, args.name, args.timeout)
    print(f"image_jobs: {'all jobs ended as expected' if not bad else f'{bad} unexpected ending(s)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
