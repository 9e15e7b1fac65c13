"""Summarize test fixtures: the worker's settings for the tiny model in a fresh folder."""
from __future__ import annotations

import signal

import pytest

from tests.summarize.notes import ENV


@pytest.fixture
def local_env(monkeypatch, tiny_llama_dir, tmp_path):
    """The worker's settings for the tiny model, the current folder a fresh one."""
    monkeypatch.setenv("MODEL_NAME", tiny_llama_dir)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("FAULT_INJECTION", "QUEUE_TIMEOUT_S", "JOB_TIMEOUT_S", "RUNPOD_API_KEY", "RUNPOD_ENDPOINT_BASE_URL",
                 "MAX_NUM_BATCHED_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fake_api_fixture(fake_cls):
    """A module-scoped fixture: a fake of RunPod's API (fake_cls, from tests/fakes) whose jobs run
    on a worker of the tiny model, started once for the module's tests. Bind it to the fixture's
    name in the test module: `rest_api = fake_api_fixture(FakeRestAPI)`."""

    @pytest.fixture(scope="module")
    def api(tiny_llama_dir):
        from handler.worker import Worker
        from tests.handler.conftest import settings_for

        with fake_cls(lambda **env: Worker(settings_for(tiny_llama_dir, **{**ENV, **env}))) as fake:
            yield fake

    return api


def point_client_at(api, monkeypatch) -> None:
    """The summarize client's RunPod key and base URL: the fake's."""
    monkeypatch.setenv("RUNPOD_API_KEY", api.api_key)
    monkeypatch.setenv("RUNPOD_ENDPOINT_BASE_URL", api.base_url)


@pytest.fixture
def terminal_sigint():
    """Ctrl-C as a terminal delivers it: SIGINT raises KeyboardInterrupt (asyncio.run then cancels
    its main task). A suite started in the background by a shell without job control inherits
    SIGINT ignored, and a Ctrl-C test would then see nothing (and one waits for its timeout)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
