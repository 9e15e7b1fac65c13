"""`python -m handler` as a subprocess, its output collected; plus an engine fault
for tests (an engine step that raises as a dead GPU would) applied before the handler starts."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Run as `python -c LAUNCH`: kills the engine at step $FAKE_ENGINE_DEAD_AT_STEP, then runs the handler.
LAUNCH = """
import os, runpy
import engine.llm_engine as le
_step, _dead_at = le.LLMEngine.step, int(os.environ["FAKE_ENGINE_DEAD_AT_STEP"])
def step(self):
    if self.step_count + 1 >= _dead_at:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (injected by the test)")
    return _step(self)
le.LLMEngine.step = step
runpy.run_module("handler", run_name="__main__", alter_sys=True)
"""

# Run as `python -c LAUNCH_SLOW`: every engine step takes $FAKE_ENGINE_STEP_DELAY_S longer (jobs that
# outlast a drain whatever the machine's speed), then runs the handler.
LAUNCH_SLOW = """
import os, runpy, time
import engine.llm_engine as le
_step, _delay = le.LLMEngine.step, float(os.environ["FAKE_ENGINE_STEP_DELAY_S"])
def step(self):
    time.sleep(_delay)
    return _step(self)
le.LLMEngine.step = step
runpy.run_module("handler", run_name="__main__", alter_sys=True)
"""


class WorkerProcess:
    def __init__(self, env: dict[str, str], args: list[str] = (), dead_at_step: int | None = None,
                 step_delay_s: float | None = None):
        full = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        full["PYTHONPATH"] = REPO + os.pathsep + full.get("PYTHONPATH", "")
        if dead_at_step is not None:
            full["FAKE_ENGINE_DEAD_AT_STEP"] = str(dead_at_step)
            cmd = [sys.executable, "-c", LAUNCH, *args]
        elif step_delay_s is not None:
            full["FAKE_ENGINE_STEP_DELAY_S"] = str(step_delay_s)
            cmd = [sys.executable, "-c", LAUNCH_SLOW, *args]
        else:
            cmd = [sys.executable, "-m", "handler", *args]
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, env=full, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, encoding="utf-8", errors="replace")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def wait_for_line(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise TimeoutError(f"no line with {needle!r}; output:\n{self.output[-4000:]}")

    def wait_for_port(self, port: int, timeout: float) -> None:
        """Until the worker listens on 127.0.0.1:`port`; fails with its output if it exits or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                return
            except OSError:
                assert time.monotonic() < deadline and self.proc.poll() is None, self.output[-3000:]
                time.sleep(0.2)

    def serve_until(self, fake, done, timeout: float, what: str) -> int:
        """Serve the fake control plane until `done` holds (fake.wait_for: fails naming `what`
        after `timeout` s, or at once if the worker exits first, with the worker's output either
        way), then stop as RunPod does, with SIGTERM: the exit status. A worker still running
        after that (the wait failed, or it took over 60 s to exit) is killed."""
        try:
            fake.wait_for(lambda: done() or self.proc.poll() is not None, timeout, what)
            if not done():  # the worker exited first: its output says why
                raise AssertionError(f"the worker exited (status {self.wait(10)}) before {what}:\n"
                                     + self.output[-4000:])
            self.proc.send_signal(signal.SIGTERM)
            return self.wait(60)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the worker's output:\n{self.output[-4000:]}") from None
        finally:
            self.stop()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
