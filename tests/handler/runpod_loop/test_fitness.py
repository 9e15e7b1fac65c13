"""The runpod SDK's start-up fitness checks as the worker configures them
(handler/runpod_loop/fitness.py): on a network where 8.8.8.8 cannot be reached the SDK alone
kills the worker; configured, the worker warns and serves, while memory and disk failures stay
fatal. Then the real `python -m handler` in production mode, its checks on and 8.8.8.8
unreachable, against the fake control plane: it starts and completes a job."""
import asyncio
import logging
import textwrap

import pytest
from runpod.serverless.modules import rp_fitness
from runpod.serverless.modules import rp_system_fitness as system

from handler.runpod_loop.fitness import SKIP, configure_fitness_checks
from tests.fakes.runpod_control_plane import FakeControlPlane
from tests.fakes.worker_process import WorkerProcess

BLOCKED = "8.8.8.8"


@pytest.fixture
def no_public_dns(monkeypatch):
    """Connections to 8.8.8.8 fail as on a network that blocks them."""
    real = asyncio.open_connection

    async def open_connection(host=None, port=None, **kw):
        if host == BLOCKED:
            raise OSError(101, "Network is unreachable")
        return await real(host, port, **kw)

    monkeypatch.setattr(asyncio, "open_connection", open_connection)


class Terminated(Exception):
    pass


@pytest.fixture
def registry(monkeypatch):
    """A fresh fitness registry; the SDK's os._exit becomes an exception, its report to the host a no-op."""
    monkeypatch.setenv(SKIP, "")  # unset, and restored after (configuring sets it in os.environ)
    monkeypatch.setattr(system, "gpu_available", lambda: False)  # CI's machine: the checks of a CPU worker

    def terminate(code: int = 1):
        raise Terminated(code)

    monkeypatch.setattr(rp_fitness, "_terminate_unhealthy", terminate)
    monkeypatch.setattr(rp_fitness, "_report_unhealthy", lambda *a: None)
    rp_fitness.clear_fitness_checks()
    rp_fitness._reset_registration_state()
    yield
    rp_fitness.clear_fitness_checks()
    rp_fitness._reset_registration_state()


def test_the_sdk_alone_kills_a_worker_without_public_dns(registry, no_public_dns):
    with pytest.raises(Terminated):
        asyncio.run(rp_fitness.run_fitness_checks())


def test_configured_the_worker_warns_and_serves_without_public_dns(registry, no_public_dns, caplog, monkeypatch):
    # the machine's own memory and disk pass whatever they are (their failures: the test below)
    monkeypatch.setattr(system, "MIN_MEMORY_GB", 0.0)
    monkeypatch.setattr(system, "MIN_DISK_PERCENT", 0.0)
    names = configure_fitness_checks()
    assert names == ["memory", "disk", "public_network"]
    with caplog.at_level(logging.WARNING, logger="handler"):
        asyncio.run(rp_fitness.run_fitness_checks())  # no Terminated
    assert any("no public network" in r.getMessage() for r in caplog.records)


def test_memory_and_disk_failures_stay_fatal(registry, monkeypatch):
    for check in ("_check_memory_availability", "_check_disk_space"):
        rp_fitness.clear_fitness_checks()
        rp_fitness._reset_registration_state()
        monkeypatch.setenv(SKIP, "")
        with monkeypatch.context() as m:
            m.setattr(system, check, lambda: (_ for _ in ()).throw(RuntimeError("too little")))
            configure_fitness_checks()
            with pytest.raises(Terminated):
                asyncio.run(rp_fitness.run_fitness_checks())


def test_a_users_skip_still_skips_them_all(registry, monkeypatch):
    monkeypatch.setenv(SKIP, "true")
    assert configure_fitness_checks() == []
    assert rp_fitness._fitness_checks == []


SITE = textwrap.dedent(f"""
    # the worker's process on a network that blocks {BLOCKED}
    import asyncio

    _real = asyncio.open_connection

    async def _open_connection(host=None, port=None, **kw):
        if host == "{BLOCKED}":
            raise OSError(101, "Network is unreachable")
        return await _real(host, port, **kw)

    asyncio.open_connection = _open_connection
""")


def test_the_worker_starts_and_serves_with_its_checks_on_and_no_public_dns(tiny_llama_dir, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITE)
    with FakeControlPlane() as fake:
        env = {**fake.worker_env(), "MODEL_NAME": tiny_llama_dir, "MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "64",
               "PYTHONPATH": str(tmp_path), "RUNPOD_MIN_MEMORY_GB": "0",
               "RUNPOD_MIN_DISK_PERCENT": "0"}
        # the memory and disk checks run and pass on any machine, however full its disk
        # (their fatal failures: test_memory_and_disk_failures_stay_fatal)
        env[SKIP] = "false"  # the checks run, as on RunPod
        fake.submit({"prompt": "Meeting notes:", "sampling_params": {"max_tokens": 4, "ignore_eos": True}}, "job")
        proc = WorkerProcess(env)
        rc = proc.serve_until(fake, lambda: fake.jobs["job"].status == "COMPLETED", 120, "the job completed")
    out = proc.output
    assert rc == 0, out[-3000:]
    assert "no public network" in out and "Network is unreachable" in out, out[-3000:]
    assert "fitness check" in out.lower(), out[-3000:]  # the SDK ran them
    assert "Memory check passed" in out and "Disk space check passed" in out, out[-3000:]
