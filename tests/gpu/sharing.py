"""One GPU shared by pytest-xdist's workers (`pytest -n 4 tests/gpu`): Triton's compiles,
most of the GPU run's time, go in parallel. A test marked `gpu_exclusive` (it sizes the
KV cache from the GPU's free memory, or caps this process's memory) runs alone: it waits
for the tests running to finish, and tests starting meanwhile wait for it.

A readers-writer lock on two files: every test takes the turnstile, then a shared lock on
the gate, and gives the turnstile back; an exclusive test keeps the turnstile until it holds
the gate alone, so that tests arriving after it cannot starve it."""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile


def lock_dir() -> str:
    """One folder per user and test run: xdist's workers share PYTEST_XDIST_TESTRUNUID."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "solo")
    path = os.path.join(tempfile.gettempdir(), f"gpu-tests-{os.getuid()}-{run}")
    os.makedirs(path, exist_ok=True)
    return path


@contextlib.contextmanager
def gpu_turn(exclusive: bool, folder: str | None = None):
    """Hold the GPU shared (exclusive=False) or alone while the block runs."""
    folder = folder or lock_dir()
    with open(os.path.join(folder, "turnstile"), "a") as turnstile, open(os.path.join(folder, "gate"), "a") as gate:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
