"""The summarize tests' documents (English, Korean, a long one, unreadable ones), the
command run with a small summary budget, and the checks of its result lines."""
from __future__ import annotations

import json
import random
from pathlib import Path

from summarize.cli import main

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


def summarize(*args: str) -> int:
    return main([*args, "--max-summary-tokens", SUMMARY_TOKENS, "--backoff", "0.05"])
