"""scripts/rehearse_image.sh fails when the wheel lacks a file the image needs:
caught by its wheel check, and, with that check skipped, by the default model's
preparation itself (the calibration text is read from the installed package).
The full, passing rehearsal is a CI step of its own (a few minutes)."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO, load_docker_module

SCRIPT = REPO / "scripts" / "rehearse_image.sh"


@pytest.fixture(scope="module")
def wheel_without_calibration(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    load_docker_module("deployfiles").materialize("wheel", out / "image")  # never build in the work tree
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--wheel-dir", str(out / "good"), str(out / "image" / "src")], check=True, capture_output=True)
    good = next((out / "good").glob("runpod_llm_worker-*.whl"))
    broken = out / good.name
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(broken, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename != "handler/prepare/data/calibration.txt":
                dst.writestr(item, src.read(item.filename))
    return broken


def _rehearse(tmp_path, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("REHEARSE_")}
    full |= {"REHEARSE_DIR": str(tmp_path / "scratch"), "PYTHON": sys.executable} | env
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=full, timeout=600)


def test_rehearsal_fails_its_wheel_check_on_a_missing_package_file(wheel_without_calibration, tmp_path):
    run = _rehearse(tmp_path, REHEARSE_WHEEL=str(wheel_without_calibration))
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "handler/prepare/data/calibration.txt" in run.stderr
    assert "FAILED: the wheel lacks package files" in run.stderr
    assert not (tmp_path / "scratch" / "root" / "models").exists(), "it stops before installing anything"


def test_rehearsal_fails_at_the_model_bake_when_the_check_is_skipped(wheel_without_calibration, tmp_path):
    """The installed package really lacks the file: preparing the default model fails."""
    if not (REPO / "handler" / "prepare" / "default_model.py").is_file():
        pytest.skip("handler/prepare/default_model.py is not there yet")
    run = _rehearse(tmp_path, REHEARSE_WHEEL=str(wheel_without_calibration), REHEARSE_SKIP_WHEEL_CHECK="1",
                    REHEARSE_DEPS_FROM=sysconfig.get_path("purelib"))
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-4000:]
    assert "FAILED: bake_model.py" in run.stderr, out[-4000:]
    assert "calibration.txt" in out
    assert "handler from " + str(tmp_path / "scratch" / "root" / "opt" / "venv") in run.stdout, \
        "the job ran on the installed wheel, not the repository"
