"""The image's scripts on their own: start.sh picks the baked model or the named
one (and offline mode) correctly; bake_model.py bakes a checkpoint checked by the
engine's rules and refuses bad ones; the wheel check catches a package file the
wheel lacks."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import models
from tests.deploy.conftest import REPO, load_docker_module

START_SH = REPO / "docker" / "start.sh"


# -- start.sh ------------------------------------------------------------------------------
@pytest.fixture
def fake_python(tmp_path):
    """Stands in for python: prints the arguments and the environment it was started with."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                      "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _baked(tmp_path, **marker) -> Path:
    folder = tmp_path / "baked"
    folder.mkdir(parents=True)
    values = {"BAKED_MODEL_NAME": "", "BAKED_MODEL_REVISION": "", "BAKED_QUANTIZATION": "",
              "BAKED_MODEL_LABEL": "SmolLM2-135M-Instruct-AWQ", "BAKED_MODEL_PATH": "cache/x"} | marker
    (folder / "baked.env").write_text("".join(f"{k}='{v}'\n" for k, v in values.items()))
    return folder


def _start(fake_python, baked, **env) -> tuple[dict, list[str], str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MODEL_NAME", "MODEL_REVISION", "QUANTIZATION", "HF_HUB_OFFLINE", "XDG_CACHE_HOME",
                          "OPENAI_SERVED_MODEL_NAME_OVERRIDE", "BASE_PATH")}
    run = subprocess.run(["sh", str(START_SH), "--test_input", "{}"], capture_output=True, text=True, check=True,
                         env=clean | {"PYTHON": str(fake_python), "BAKED_MODEL_DIR": str(baked)} | env)
    out = json.loads(run.stdout)
    return out["env"], out["argv"], run.stderr


def test_start_serves_the_baked_default_model_offline(fake_python, tmp_path):
    baked = _baked(tmp_path)
    env, argv, log = _start(fake_python, baked, BASE_PATH="/runpod-volume")
    assert argv == ["-m", "handler", "--test_input", "{}"]
    assert "MODEL_NAME" not in env  # the worker's own default-model path finds it
    assert env["XDG_CACHE_HOME"] == f"{baked}/cache" and env["HF_HUB_OFFLINE"] == "1"
    assert "baked default model" in log


def test_start_serves_a_baked_named_model_under_its_name(fake_python, tmp_path):
    baked = _baked(tmp_path, BAKED_MODEL_NAME="Qwen/Qwen2.5-7B-Instruct-AWQ", BAKED_MODEL_REVISION="main",
                   BAKED_QUANTIZATION="awq", BAKED_MODEL_LABEL="Qwen/Qwen2.5-7B-Instruct-AWQ",
                   BAKED_MODEL_PATH="model")
    for extra in ({}, {"MODEL_NAME": "Qwen/Qwen2.5-7B-Instruct-AWQ"},
                  {"MODEL_NAME": "Qwen/Qwen2.5-7B-Instruct-AWQ", "MODEL_REVISION": "main"}):
        env, _, _ = _start(fake_python, baked, **extra)
        assert env["MODEL_NAME"] == f"{baked}/model", extra
        assert "MODEL_REVISION" not in env
        assert env["QUANTIZATION"] == "awq" and env["HF_HUB_OFFLINE"] == "1"
        assert env["OPENAI_SERVED_MODEL_NAME_OVERRIDE"] == "Qwen/Qwen2.5-7B-Instruct-AWQ"


def test_start_leaves_another_model_to_the_hub_and_the_volume(fake_python, tmp_path):
    baked = _baked(tmp_path, BAKED_MODEL_NAME="Qwen/Qwen2.5-7B-Instruct-AWQ", BAKED_MODEL_PATH="model")
    for extra in ({"MODEL_NAME": "Qwen/Qwen2.5-14B-Instruct-AWQ"},
                  {"MODEL_NAME": "Qwen/Qwen2.5-7B-Instruct-AWQ", "MODEL_REVISION": "other-branch"}):
        env, _, log = _start(fake_python, baked, BASE_PATH="/runpod-volume", **extra)
        assert env["MODEL_NAME"] == extra["MODEL_NAME"]
        assert "HF_HUB_OFFLINE" not in env and "OPENAI_SERVED_MODEL_NAME_OVERRIDE" not in env
        assert "cached under /runpod-volume" in log
    default = _baked(tmp_path / "d")
    env, _, _ = _start(fake_python, default, MODEL_NAME="Qwen/Qwen2.5-14B-Instruct-AWQ")
    assert env["MODEL_NAME"] == "Qwen/Qwen2.5-14B-Instruct-AWQ" and "HF_HUB_OFFLINE" not in env


def test_start_respects_explicit_settings_and_runs_without_a_baked_model(fake_python, tmp_path):
    baked = _baked(tmp_path, BAKED_MODEL_NAME="m/awq", BAKED_MODEL_PATH="model", BAKED_MODEL_LABEL="m/awq")
    env, _, _ = _start(fake_python, baked, HF_HUB_OFFLINE="0", OPENAI_SERVED_MODEL_NAME_OVERRIDE="mine")
    assert env["HF_HUB_OFFLINE"] == "0" and env["OPENAI_SERVED_MODEL_NAME_OVERRIDE"] == "mine"
    env, argv, log = _start(fake_python, tmp_path / "nothing-here")
    assert "MODEL_NAME" not in env and "HF_HUB_OFFLINE" not in env and argv[:2] == ["-m", "handler"]
    assert "no baked model" in log


# -- bake_model.py ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bake_model():
    return load_docker_module("bake_model")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return Path(models.make_checkpoint(str(tmp_path_factory.mktemp("ckpt") / "tiny"), "llama"))


def test_bake_copies_a_checked_checkpoint_with_its_marker(bake_model, tiny_checkpoint, tmp_path):
    (tiny_checkpoint / "notes.bin").write_bytes(b"not copied")  # outside the engine's file patterns
    out = bake_model.bake(tmp_path / "baked", str(tiny_checkpoint), None, "none", token=None)
    names = {p.name for p in (out / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names and "notes.bin" not in names
    marker = dict(line.split("=", 1) for line in (out / "baked.env").read_text().splitlines()
                  if not line.startswith("#"))
    assert marker["BAKED_MODEL_PATH"] == "model" and marker["BAKED_QUANTIZATION"] == "none"
    assert marker["BAKED_MODEL_NAME"] == f"'{tiny_checkpoint}'" or marker["BAKED_MODEL_NAME"] == str(tiny_checkpoint)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder left"
    with pytest.raises(SystemExit, match="not empty"):
        bake_model.bake(out, str(tiny_checkpoint), None, None, token=None)


def test_bake_refuses_what_the_engine_would_refuse(bake_model, tiny_checkpoint, tmp_path):
    from engine.errors import ModelLoadError, UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="QUANTIZATION=awq"):
        bake_model.bake(tmp_path / "a", str(tiny_checkpoint), None, "awq", token=None)
    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_checkpoint, pickled, ignore=shutil.ignore_patterns("*.safetensors"))
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04.")
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        bake_model.bake(tmp_path / "b", str(pickled), None, None, token=None)
    with pytest.raises(SystemExit, match="QUANTIZATION"):
        bake_model.bake(tmp_path / "c", str(tiny_checkpoint), None, "bitsandbytes", token=None)
    assert not any(p.name in ("a", "b", "c") or p.name.startswith(".") for p in tmp_path.iterdir()
                   if p.name != "pickled"), "a failed bake leaves nothing behind"


def test_bake_reads_the_token_from_the_secret_file(bake_model, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    secret = tmp_path / "hf_token"
    assert bake_model._read_token(str(secret)) is None
    secret.write_text("hf_secret\n")
    assert bake_model._read_token(str(secret)) == "hf_secret"
    monkeypatch.setenv("HF_TOKEN", "hf_env")
    assert bake_model._read_token(str(tmp_path / "absent")) == "hf_env"


# -- the wheel against the package files -----------------------------------------------------
@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory):
    """The wheel as the image's wheel stage builds it, from the materialized build context."""
    deployfiles = load_docker_module("deployfiles")
    root = tmp_path_factory.mktemp("image")
    deployfiles.materialize("wheel", root)
    (root / "src" / "handler" / "prepare" / "data" / "extra_template.j2").write_text("{{ not packaged }}")
    out = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--wheel-dir", str(out), str(root / "src")], check=True)
    (root / "src" / "handler" / "prepare" / "data" / "extra_template.j2").unlink()
    return next(out.glob("runpod_llm_worker-*.whl")), root / "src"


def _without(wheel: Path, member: str, out: Path) -> Path:
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w") as dst:
        assert member in src.namelist()
        for item in src.infolist():
            if item.filename != member:
                dst.writestr(item, src.read(item.filename))
    return out


def test_the_wheel_holds_every_package_file(built_wheel):
    deployfiles = load_docker_module("deployfiles")
    wheel, src = built_wheel
    assert deployfiles.missing_from_wheel(wheel, src) == []
    assert "handler/prepare/data/calibration.txt" in deployfiles.wheel_files(wheel)


def test_the_wheel_check_fails_on_a_file_the_wheel_lacks(built_wheel, tmp_path):
    deployfiles = load_docker_module("deployfiles")
    wheel, src = built_wheel
    broken = _without(wheel, "handler/prepare/data/calibration.txt", tmp_path / wheel.name)
    assert deployfiles.missing_from_wheel(broken, src) == ["handler/prepare/data/calibration.txt"]
    run = subprocess.run([sys.executable, str(REPO / "docker" / "deployfiles.py"), "wheel-check", str(broken), str(src)],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "handler/prepare/data/calibration.txt" in run.stderr


def test_the_wheel_check_catches_a_file_pyproject_does_not_package(built_wheel, tmp_path):
    """A data file whose suffix package-data does not match is left out of a real build."""
    deployfiles = load_docker_module("deployfiles")
    wheel, src = built_wheel
    assert "handler/prepare/data/extra_template.j2" not in deployfiles.wheel_files(wheel)
    (src / "handler" / "prepare" / "data" / "extra_template.j2").write_text("{{ x }}")
    try:
        assert deployfiles.missing_from_wheel(wheel, src) == ["handler/prepare/data/extra_template.j2"]
    finally:
        (src / "handler" / "prepare" / "data" / "extra_template.j2").unlink()
