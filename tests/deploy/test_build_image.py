"""The real image build's helpers (scripts/build_image.sh runs them; the build itself is a
CI step): hostpip hands the build this machine's pip configuration with local folders served
over HTTP and nothing else; run_image_jobs sends every tests.json job besides its own, each
a valid worker input; .ci/run falls back to the rehearsal only when Docker cannot run."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from functools import partial
from http.server import ThreadingHTTPServer

import pytest

from tests.deploy.conftest import REPO, load_docker_module


@pytest.fixture(scope="module")
def hostpip():
    return load_docker_module("hostpip")


def test_hostpip_rewrites_local_locations_and_drops_host_paths(hostpip, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (tmp_path / "pypi" / "simple").mkdir(parents=True)
    (tmp_path / "ca.crt").write_text("CERT")
    (tmp_path / "constraints.txt").write_text("torch<=3\n")
    options = {"cert": str(tmp_path / "ca.crt"), "find-links": str(wheels),
               "extra-index-url": f"file://{tmp_path}/pypi/simple https://example.org/simple",
               "constraint": str(tmp_path / "constraints.txt"), "cache-dir": "/root/.cache/pip",
               "default-timeout": "180", "index-url": f"{tmp_path}/absent"}
    out = tmp_path / "out"
    out.mkdir()
    conf, served = hostpip.translate(options, "http://127.0.0.1:9", out)
    assert conf["cert"] == "/run/secrets/pip_cert" and (out / "pip_cert").read_text() == "CERT"
    assert served == [wheels, tmp_path / "pypi", tmp_path / "constraints.txt"]
    assert conf["find-links"] == "http://127.0.0.1:9/0/"
    assert conf["extra-index-url"] == "http://127.0.0.1:9/1/simple/ https://example.org/simple"
    assert conf["constraint"] == "http://127.0.0.1:9/2/constraints.txt"
    assert conf["default-timeout"] == "180" and "cache-dir" not in conf and "index-url" not in conf


def test_hostpip_serves_only_the_configured_folders(hostpip, tmp_path):
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "torch-1-py3-none-any.whl").write_bytes(b"wheel")
    (tmp_path / "secret.txt").write_text("not served")
    (tmp_path / "c.txt").write_text("torch<=3\n")
    handler = type("H", (hostpip._Handler,), {"roots": [tmp_path / "wheels", tmp_path / "c.txt"]})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert b"torch-1-py3-none-any.whl" in urllib.request.urlopen(f"{base}/0/").read()
        assert urllib.request.urlopen(f"{base}/0/torch-1-py3-none-any.whl").read() == b"wheel"
        assert urllib.request.urlopen(f"{base}/1/c.txt").read() == b"torch<=3\n"
        for path in ("/0/../secret.txt", "/0/%2e%2e/secret.txt", "/1/secret.txt", "/2/", "/x/"):
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(base + path)
    finally:
        server.shutdown()
        server.server_close()


def test_the_container_run_sends_every_hub_test_and_the_contract_endings():
    from handler.job_input import parse_job_input
    from handler.settings import load_settings

    jobs = load_docker_module("run_image_jobs")._jobs(REPO / ".runpod" / "tests.json")
    names = [name for name, _, _ in jobs]
    hub_tests = json.loads((REPO / ".runpod" / "tests.json").read_text())["tests"]
    assert {f"tests.json {t['name']}" for t in hub_tests} <= set(names)
    wanted = {want for _, _, want in jobs}
    assert wanted == {"COMPLETED", "prompt_too_long", "truncated"}
    assert jobs[0][1]["stream"] is True, "the first job's first streamed token times the cold start"
    readme_job = json.loads((REPO / "examples" / "summarize_job.json").read_text())["input"]
    assert ("README summarize job", readme_job, "COMPLETED") in jobs
    settings = load_settings({})
    for _, job, _ in jobs:
        parse_job_input(job, settings)  # raises JobError(invalid_input) naming the field


def test_ci_falls_back_to_the_rehearsal_only_when_docker_cannot_run():
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash scripts/build_image.sh" in ci
    assert ci.index("bash scripts/build_image.sh") < ci.index('if [ "$image" -eq 3 ]') < \
        ci.index("bash scripts/rehearse_image.sh")
    script = (REPO / "scripts" / "build_image.sh").read_text()
    assert 'unavailable() { say "Docker cannot run here: $*"; exit 3; }' in script
    # a failed build or job is exit 1, never 3: it fails CI instead of falling back
    assert 'say "FAILED: docker build"\n    exit 1' in script
