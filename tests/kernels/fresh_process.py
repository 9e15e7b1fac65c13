"""Ahead-of-time compile checks in a fresh Python process: once a process has launched Triton
kernels under TRITON_INTERPRET=1, compiling a kernel for a GPU target in it can fail on the
interpreter's leftovers ("'value' object has no attribute 'dtype'"), depending on which tests
ran before. run_fresh calls module.function(*args) in a new interpreter instead."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = 77  # the child's exit status when the check skipped itself (pytest.skip)

_CHILD = """
import json, sys
from importlib import import_module
module, name, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    getattr(import_module(module), name)(*args)
except BaseException as exc:
    if type(exc).__name__ == "Skipped":
        print(exc)
        sys.exit(77)
    raise
"""


def run_fresh(module: str, name: str, *args) -> None:
    """module.name(*args) in a new process in compiled mode; its failure fails the test, its skip skips it."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    run = subprocess.run([sys.executable, "-c", _CHILD, module, name, json.dumps(args)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    if run.returncode == SKIPPED:
        pytest.skip(run.stdout.strip())
    assert run.returncode == 0, run.stderr[-4000:]
