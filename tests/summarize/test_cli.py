"""The summarize command in local mode on the tiny model: every document one line (folders,
JSONL, empty and binary files, a long document in chunks), reruns and interrupted runs resume."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from summarize import local
from summarize.store import ResultStore
from tests.summarize.notes import (
    ENGLISH, EXPECTED, KOREAN, SENTENCES, by_doc, check_line, make_notes, read_lines, summarize)


@pytest.fixture
def jobs_run(monkeypatch):
    """The document texts the local worker is given, in order."""
    texts: list[str] = []
    real = local.run_job

    async def spy(handler, job):
        texts.append(job["input"]["summarize"]["text"])
        return await real(handler, job)

    monkeypatch.setattr(local, "run_job", spy)
    return texts


def test_a_folder_and_a_jsonl_give_one_line_per_document(local_env, capsys):
    make_notes(local_env)
    records = [{"id": "memo-1", "text": "What is the capital of France? Paris is the capital of France."},
               {"id": "memo-2", "text": "   \n"}, "not json", {"id": "메모-3", "text": KOREAN}]
    (local_env / "memos.jsonl").write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records) + "\n",
        encoding="utf-8")

    rc = summarize("notes", "memos.jsonl", "--out", "results.jsonl", "--report", "report.md", "--concurrency", "4")

    assert rc == 3  # only documents that can never succeed failed (empty, binary, a bad record)
    lines = by_doc(read_lines(local_env / "results.jsonl"))
    expected = {**EXPECTED, "memo-1": "summary", "memo-2": "empty_document", "memos.jsonl:3": "bad_record",
                "메모-3": "summary"}
    assert set(lines) == set(expected)  # the hidden .DS_Store is left out, nothing else
    for doc, outcome in expected.items():
        check_line(lines[doc], outcome)
    long = lines["notes/archive/long.md"]
    assert long["chunks"] > 1 and long["rounds"] >= 1 and long["usage"]["prompt_tokens"] > 2 * 512
    assert lines["notes/standup.md"]["chunks"] == 1
    assert lines["memo-1"]["source"] == "memos.jsonl:1"
    raw = (local_env / "results.jsonl").read_text(encoding="utf-8")
    assert "회의록" in raw and "메모-3" in raw  # UTF-8 as is, not \u escapes
    report = (local_env / "report.md").read_text(encoding="utf-8")
    for doc in expected:
        assert f"## {doc}\n" in report
    assert "**Failed** (binary_file)" in report and "**Failed** (empty_document)" in report
    out = capsys.readouterr().out
    assert "4 failed" in out and "notes/logo.png: binary_file" in out


def test_a_rerun_skips_finished_documents_and_redoes_changed_ones(local_env, jobs_run):
    notes = make_notes(local_env)
    assert summarize("notes", "--out", "results.jsonl") == 3
    first = by_doc(read_lines(local_env / "results.jsonl"))
    assert len(jobs_run) == 3  # the three text documents; empty and binary ones fail before any job
    jobs_run.clear()

    assert summarize("notes", "--out", "results.jsonl") == 3
    assert jobs_run == []  # nothing done again; the failed ones were retried (and fail the same way)
    second = by_doc(read_lines(local_env / "results.jsonl"))
    assert set(second) == set(first)
    for doc, outcome in EXPECTED.items():
        if outcome == "summary":
            assert second[doc] == first[doc]
        check_line(second[doc], outcome)

    (notes / "standup.md").write_text(ENGLISH + "- New: the launch moves to April 16.\n", encoding="utf-8")
    assert summarize("notes", "--out", "results.jsonl") == 3
    assert len(jobs_run) == 1 and "April 16" in jobs_run[0]  # same path, new content: done again
    third = by_doc(read_lines(local_env / "results.jsonl"))
    assert set(third) == set(first)
    assert third["notes/standup.md"]["sha256"] != first["notes/standup.md"]["sha256"]
    assert third["notes/회의록.txt"] == first["notes/회의록.txt"]


def test_an_interrupted_run_loses_nothing_finished_and_resumes(local_env, monkeypatch, jobs_run, capsys,
                                                              terminal_sigint):
    folder = local_env / "many"
    folder.mkdir()
    rng = random.Random(7)
    for i in range(10):
        (folder / f"note-{i:02d}.txt").write_text(f"Note {i}. " + " ".join(rng.sample(SENTENCES, 2)),
                                                  encoding="utf-8")
    real_append = ResultStore.append
    written = []

    def append_then_ctrl_c(self, line):
        real_append(self, line)
        written.append(line["doc"])
        if len(written) == 3:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C, as the terminal sends it

    monkeypatch.setattr(ResultStore, "append", append_then_ctrl_c)
    rc = summarize("many", "--out", "results.jsonl", "--report", "report.md", "--concurrency", "2")

    assert rc == 130
    assert "rerun the same command to resume" in capsys.readouterr().out
    done = by_doc(read_lines(local_env / "results.jsonl"))  # every line whole
    assert 3 <= len(done) < 10 and set(done) <= set(written)
    for line in done.values():
        check_line(line, "summary")
    assert "not finished" in (local_env / "report.md").read_text(encoding="utf-8")

    monkeypatch.setattr(ResultStore, "append", real_append)
    jobs_run.clear()
    assert summarize("many", "--out", "results.jsonl") == 0
    final = by_doc(read_lines(local_env / "results.jsonl"))
    assert len(final) == 10
    assert len(jobs_run) == 10 - len(done)  # only the unfinished ones ran
    for doc, line in done.items():
        assert final[doc] == line


def test_python_dash_m_runs_the_command(local_env):
    out = subprocess.run([sys.executable, "-m", "summarize", "--help"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert out.returncode == 0 and "--endpoint" in out.stdout and "resumes" in out.stdout
    missing = subprocess.run([sys.executable, "-m", "summarize", "nowhere", "--out", "r.jsonl"],
                             capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert missing.returncode == 2 and "nowhere: no such file or folder" in missing.stderr


def test_documents_that_can_never_succeed_have_an_exit_status_of_their_own(local_env, jobs_run, capsys):
    make_notes(local_env)
    assert summarize("notes", "--out", "r.jsonl") == 3  # the summaries are done; empty.txt and logo.png never can be
    assert "--skip-unreadable leaves them out" in capsys.readouterr().out
    assert summarize("notes", "--out", "r.jsonl") == 3  # a rerun: the same, and no job run again
    assert len(jobs_run) == 3

    # --skip-unreadable: they are left out (no line of their own), the run is a success
    assert summarize("notes", "--out", "s.jsonl", "--skip-unreadable") == 0
    assert set(by_doc(read_lines(local_env / "s.jsonl"))) == {d for d, o in EXPECTED.items() if o == "summary"}
    assert "left out 2 documents that cannot be read" in capsys.readouterr().err

    # a real failure (instructions too long for any prompt) still exits 1, whatever else failed
    too_long = "Mention every name and every date. " * 60
    assert summarize("notes", "--out", "bad.jsonl", "--instructions", too_long) == 1
    assert summarize("notes", "--out", "bad2.jsonl", "--instructions", too_long, "--skip-unreadable") == 1
    assert summarize("notes/empty.txt", "--out", "e.jsonl", "--skip-unreadable") == 2  # nothing left to do


def test_the_help_documents_the_exit_statuses(capsys):
    from summarize.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--skip-unreadable" in text and "0 every document done" in text
    assert "1 some document failed and a rerun retries it" in text and "3 every document that can be read" in text
