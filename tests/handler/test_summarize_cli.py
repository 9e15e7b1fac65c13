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

from handler import summarize_local
from handler.summarize import main
from handler.summarize_store import ResultStore

# the tiny model's context: large enough for the command's prompt (its tokenizer knows few words),
# small enough that LONG needs several chunks
ENV = {"MAX_MODEL_LEN": "512", "NUM_KV_BLOCKS": "256", "METRICS_LOG_INTERVAL_S": "0", "DEFAULT_MAX_TOKENS": "16"}
SUMMARY_TOKENS = "12"

ENGLISH = ("# Standup, March 3\n\n- The team discussed the budget, the roadmap and hiring plans for next quarter.\n"
           "- Action items: Alice sends the report on Friday; Bob reviews the contract.\n")
KOREAN = ("회의록: 오늘 회의에서 예산과 일정, 채용 계획을 논의했습니다.\n"
          "결정 사항: 다음 주 금요일까지 보고서를 제출합니다. 감사합니다!\n")
SENTENCES = [
    "Meeting notes: the team discussed the budget, the roadmap and hiring plans for next quarter.",
    "Action items: Alice sends the report on Friday; Bob reviews the contract.",
    "회의록: 오늘 회의에서 예산과 일정, 채용 계획을 논의했습니다.",
    "日本語のテキストも少し含めます。東京は日本の首都です。",
]


def long_text(n: int = 60, seed: int = 1) -> str:
    """About 3,000 tokens of the tiny tokenizer: six times its 512-token context."""
    rng = random.Random(seed)
    return "\n".join(rng.choice(SENTENCES) for _ in range(n))


def make_notes(root: Path) -> Path:
    """English and Korean notes, a long document, an empty file, a binary file, a hidden one."""
    notes = root / "notes"
    (notes / "archive").mkdir(parents=True)
    (notes / "standup.md").write_text(ENGLISH, encoding="utf-8")
    (notes / "회의록.txt").write_text(KOREAN, encoding="utf-8")
    (notes / "archive" / "long.md").write_text(long_text(), encoding="utf-8")
    (notes / "empty.txt").write_bytes(b"")
    (notes / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00")
    (notes / ".DS_Store").write_bytes(b"\x00\x01")
    return notes


EXPECTED = {  # doc (relative to the notes' parent) -> the status it must end with
    "notes/standup.md": "summary", "notes/회의록.txt": "summary", "notes/archive/long.md": "summary",
    "notes/empty.txt": "empty_document", "notes/logo.png": "binary_file",
}


def read_lines(path: Path) -> list[dict]:
    return [json.loads(raw) for raw in path.read_text(encoding="utf-8").splitlines() if raw.strip()]


def by_doc(lines: list[dict]) -> dict[str, dict]:
    docs = [line["doc"] for line in lines]
    assert len(docs) == len(set(docs)), f"a document has more than one line: {docs}"
    return {line["doc"]: line for line in lines}


def check_line(line: dict, expected: str) -> None:
    """`summary`: ok or truncated with a summary; else failed with that error code."""
    assert {"doc", "status", "summary", "chunks", "usage", "error"} <= set(line), line
    if expected == "summary":
        assert line["status"] in ("ok", "truncated"), line
        assert line["summary"].strip() and line["error"] is None and line["chunks"] >= 1
        assert line["usage"]["completion_tokens"] > 0
    else:
        assert line["status"] == "failed" and line["summary"] is None, line
        assert line["error"]["code"] == expected and line["error"]["message"], line
        assert line["error"]["retryable"] is False


@pytest.fixture
def local_env(monkeypatch, tiny_llama_dir, tmp_path):
    """The worker's settings for the tiny model, the current folder a fresh one."""
    monkeypatch.setenv("MODEL_NAME", tiny_llama_dir)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("FAULT_INJECTION", "QUEUE_TIMEOUT_S", "JOB_TIMEOUT_S", "RUNPOD_API_KEY", "RUNPOD_ENDPOINT_BASE_URL",
                 "MAX_NUM_BATCHED_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def jobs_run(monkeypatch):
    """The document texts the local worker is given, in order."""
    texts: list[str] = []
    real = summarize_local.run_job

    async def spy(handler, job):
        texts.append(job["input"]["summarize"]["text"])
        return await real(handler, job)

    monkeypatch.setattr(summarize_local, "run_job", spy)
    return texts


def summarize(*args: str) -> int:
    return main([*args, "--max-summary-tokens", SUMMARY_TOKENS, "--backoff", "0.05"])


def test_a_folder_and_a_jsonl_give_one_line_per_document(local_env, capsys):
    make_notes(local_env)
    records = [{"id": "memo-1", "text": "What is the capital of France? Paris is the capital of France."},
               {"id": "memo-2", "text": "   \n"}, "not json", {"id": "메모-3", "text": KOREAN}]
    (local_env / "memos.jsonl").write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records) + "\n",
        encoding="utf-8")

    rc = summarize("notes", "memos.jsonl", "--out", "results.jsonl", "--report", "report.md", "--concurrency", "4")

    assert rc == 1  # some documents failed
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
    assert summarize("notes", "--out", "results.jsonl") == 1
    first = by_doc(read_lines(local_env / "results.jsonl"))
    assert len(jobs_run) == 3  # the three text documents; empty and binary ones fail before any job
    jobs_run.clear()

    assert summarize("notes", "--out", "results.jsonl") == 1
    assert jobs_run == []  # nothing done again; the failed ones were retried (and fail the same way)
    second = by_doc(read_lines(local_env / "results.jsonl"))
    assert set(second) == set(first)
    for doc, outcome in EXPECTED.items():
        if outcome == "summary":
            assert second[doc] == first[doc]
        check_line(second[doc], outcome)

    (notes / "standup.md").write_text(ENGLISH + "- New: the launch moves to April 16.\n", encoding="utf-8")
    assert summarize("notes", "--out", "results.jsonl") == 1
    assert len(jobs_run) == 1 and "April 16" in jobs_run[0]  # same path, new content: done again
    third = by_doc(read_lines(local_env / "results.jsonl"))
    assert set(third) == set(first)
    assert third["notes/standup.md"]["sha256"] != first["notes/standup.md"]["sha256"]
    assert third["notes/회의록.txt"] == first["notes/회의록.txt"]


def test_an_interrupted_run_loses_nothing_finished_and_resumes(local_env, monkeypatch, jobs_run, capsys):
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
    out = subprocess.run([sys.executable, "-m", "handler.summarize", "--help"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert out.returncode == 0 and "--endpoint" in out.stdout and "resumes" in out.stdout
    missing = subprocess.run([sys.executable, "-m", "handler.summarize", "nowhere", "--out", "r.jsonl"],
                             capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert missing.returncode == 2 and "nowhere: no such file or folder" in missing.stderr
