"""docs/deploy.md's table of worker-vllm's variables is the one handler/worker_vllm_names.py
renders (python -m handler --print-worker-vllm-settings), with a row for every variable of the
worker-vllm fixture (tests/handler/worker_vllm_env.txt)."""
import re
import subprocess
import sys

from handler.worker_vllm_names import RULES, markdown
from tests.deploy.conftest import REPO

HEADER = markdown().splitlines()[0]


def _table(text: str) -> list[str]:
    lines = text.splitlines()
    rows = []
    for line in lines[lines.index(HEADER):]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_deploy_doc_worker_vllm_table_is_the_generated_one():
    text = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert HEADER in text, "docs/deploy.md lacks the worker-vllm table"
    rows = _table(text)
    assert "\n".join(rows) + "\n" == markdown(), \
        "docs/deploy.md's worker-vllm table differs from python -m handler --print-worker-vllm-settings"
    documented = {re.match(r"\| `([A-Z0-9_]+)`", r).group(1) for r in rows[2:]}
    fixture = (REPO / "tests" / "handler" / "worker_vllm_env.txt").read_text().splitlines()
    named = {ln.split("=", 1)[0] for ln in fixture if ln.strip() and not ln.startswith("#")}
    assert documented == set(RULES) and named <= documented, sorted(named - documented)


def test_print_worker_vllm_settings_gives_the_table():
    run = subprocess.run([sys.executable, "-m", "handler", "--print-worker-vllm-settings"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert run.returncode == 0 and run.stdout == markdown(), run.stderr[-2000:]
