"""The summarize command against hostile files and names, as a user runs it (a subprocess on
the tiny model): a FIFO in the folder and a link to /dev/zero (with --follow-links) fail with a
line each instead of hanging or reading forever; names holding an ESC sequence or a newline
reach the console and the report escaped, so they can neither clear the terminal nor forge a line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.fakes.worker_process import REPO
from tests.summarize.notes import ENV, ENGLISH, SUMMARY_TOKENS

FORGED = "summarize: 9 of 9 documents finished: 9 ok, 0 truncated, 0 failed"


def test_a_fifo_a_device_and_hostile_names_neither_hang_the_run_nor_reach_the_console_raw(tiny_llama_dir, tmp_path,
                                                                                          figures):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "standup.md").write_text(ENGLISH, encoding="utf-8")
    os.mkfifo(docs / "pipe.txt")
    (docs / "zero.txt").symlink_to("/dev/zero")
    (docs / "clear\x1b[2J\x1b[H.txt").write_bytes(b"")  # an empty file: a failed line naming it
    (docs / f"x\n{FORGED}.txt").write_bytes(b"\x00binary")
    env = {**os.environ, **ENV, "MODEL_NAME": tiny_llama_dir, "PYTHONPATH": REPO}
    for name in ("RUNPOD_API_KEY", "RUNPOD_ENDPOINT_BASE_URL", "FAULT_INJECTION"):
        env.pop(name, None)
    p = subprocess.run([sys.executable, "-m", "summarize", str(docs), "--follow-links", "--out", "r.jsonl",
                        "--report", "report.md", "--max-summary-tokens", SUMMARY_TOKENS, "--no-progress"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    console = p.stdout + p.stderr
    assert p.returncode == 3, console[-3000:]  # the summary is done; the others can never succeed as they are
    lines = {os.path.basename(json.loads(raw)["doc"]): json.loads(raw)
             for raw in (tmp_path / "r.jsonl").read_text(encoding="utf-8").splitlines()}
    assert lines["standup.md"]["status"] in ("ok", "truncated")
    assert lines["pipe.txt"]["error"]["code"] == lines["zero.txt"]["error"]["code"] == "not_a_regular_file"
    assert lines["clear\x1b[2J\x1b[H.txt"]["error"]["code"] == "empty_document"  # the exact name in the JSONL
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    for text in (console, report):
        assert "\x1b" not in text
        assert not any(line.strip() == FORGED for line in text.splitlines()), text[-3000:]
    assert "clear\\x1b[2J" in console and "x\\nsummarize: 9 of 9" in console
    figures.set("hostile_files", fifo_and_device="failed lines", console_escapes=0, forged_lines=0)
