"""Reading documents for the summarize command, and Korean and Japanese text through the
token chunking the worker's map-reduce uses: every chunk whole characters of the source."""
from __future__ import annotations

import asyncio
import codecs
import json
import os
import re

import pytest

from handler.summarize import core
from summarize import inputs
from summarize.inputs import InputError, collect, decode_text
from summarize.runner import Options
from tests.summarize.notes import SENTENCES


@pytest.mark.parametrize("data, text, code", [
    ("회의록 노트".encode(), "회의록 노트", None),
    (codecs.BOM_UTF8 + "日本語".encode(), "日本語", None),
    (codecs.BOM_UTF16_LE + "회의록".encode("utf-16-le"), "회의록", None),
    (b"", None, "empty_document"),
    (b" \n\t\n", None, "empty_document"),
    (b"PK\x03\x04\x00\x00", None, "binary_file"),
    ("café".encode("latin-1"), None, "undecodable"),
])
def test_decode_text(data, text, code):
    got, error = decode_text(data)
    assert got == text
    assert (error or {}).get("code") == code
    if error:
        assert error["retryable"] is False and error["message"]


def test_collect_reads_folders_recursively_and_leaves_out_hidden_and_own_files(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "one.md").write_text("one", encoding="utf-8")
    (tmp_path / "a" / "b" / "two.txt").write_text("two", encoding="utf-8")
    (tmp_path / "a" / ".git").mkdir()
    (tmp_path / "a" / ".git" / "HEAD").write_text("ref", encoding="utf-8")
    (tmp_path / "a" / "results.jsonl").write_text("", encoding="utf-8")
    docs = collect([str(tmp_path / "a"), str(tmp_path / "a" / "one.md")],
                   exclude=[str(tmp_path / "a" / "results.jsonl")])
    # a folder's own files, then its subfolders'; one.md given twice is one document
    assert [d.doc for d in docs] == [str(tmp_path / "a" / "one.md"), str(tmp_path / "a" / "b" / "two.txt")]
    with pytest.raises(InputError, match="no such file"):
        collect([str(tmp_path / "missing")])


def test_a_repeated_jsonl_id_fails_under_its_own_name(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"id": "x", "text": "a"}\n{"id": "x", "text": "b"}\n{"text": "c"}\n',
                                      encoding="utf-8")
    docs = collect([str(tmp_path / "d.jsonl")])
    assert [d.doc for d in docs] == ["x", f"x ({tmp_path}/d.jsonl:2)", f"{tmp_path}/d.jsonl:3"]
    assert docs[1].error["code"] == "duplicate_document" and docs[2].error is None


def test_the_prompt_asks_for_the_documents_own_language():
    assert "same language as the text." in Options().prompt_instructions()
    told = Options(style="paragraph", instructions="Answer in English.").prompt_instructions()
    assert told.endswith("unless these instructions say otherwise: Answer in English.") and "paragraph" in told


def test_korean_and_japanese_survive_token_chunking(tiny_llama_dir):
    from engine.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_llama_dir)
    # Korean and Japanese (3 UTF-8 bytes a character, often cut by a token boundary), numbered lines
    text = "\n".join(f"{i}. {s}" for i, s in enumerate(SENTENCES[2:] * 40))
    chunks: list[str] = []

    async def run(messages, max_tokens, tag):
        body = messages[-1]["content"].split("\n\n", 1)[1]
        if tag.startswith("r1"):
            chunks.append(body)
        return core.Piece("요약", "stop", 1, 1)

    def count(messages):
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tok.encode(prompt, add_special_tokens=False))

    plan = asyncio.run(core.reduce_to_fit(
        text, count_tokens=count, encode=lambda t: tok.encode(t, add_special_tokens=False),
        decode=lambda ids: tok.decode(ids, skip_special_tokens=True), run=run, context_tokens=512,
        summary_tokens=16))
    assert plan.chunks == len(chunks) > 3
    covered, start = [False] * len(text), 0
    for chunk in chunks:  # in order: each starts at or after the previous one
        assert "\ufffd" not in chunk
        start = text.find(chunk, start)
        assert start >= 0, f"a chunk is not a piece of the text: {chunk[:40]!r}"
        covered[start:start + len(chunk)] = [True] * len(chunk)
    assert all(covered[:-1])  # nothing lost between chunks (the last newline may be trimmed)


def test_links_out_of_a_folder_are_not_followed_unless_asked(tmp_path):
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text("SECRET elsewhere", encoding="utf-8")
    (outside / "dir" / "more.txt").write_text("MORE elsewhere", encoding="utf-8")
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("a document", encoding="utf-8")
    (docs / "secret.txt").symlink_to(outside / "secret.txt")
    (docs / "dir").symlink_to(outside / "dir")
    (docs / "sub" / "up.txt").symlink_to("../../outside/secret.txt")  # relative, through ..
    (docs / "same.txt").symlink_to(docs / "a.txt")  # a link that stays inside: read
    (docs / "loop").symlink_to(docs)  # a link back up: never read twice, never endless
    found = {os.path.relpath(d.doc, docs): d for d in collect([str(docs)])}
    assert found["a.txt"].text == "a document" and found["same.txt"].text == "a document"
    for name in ("secret.txt", "dir", os.path.join("sub", "up.txt")):
        d = found[name]
        assert d.text is None and d.error["code"] == "link_outside_folder" and "--follow-links" in d.error["message"]
    assert set(found) == {"a.txt", "same.txt", "secret.txt", "dir", os.path.join("sub", "up.txt")}
    assert "elsewhere" not in repr(list(found.values()))

    followed = {os.path.relpath(d.doc, docs): d for d in collect([str(docs)], follow_links=True)}
    assert followed["secret.txt"].text == "SECRET elsewhere" and followed[os.path.join("sub", "up.txt")].text
    assert followed[os.path.join("dir", "more.txt")].text == "MORE elsewhere"
    assert not any(name.startswith("loop") for name in followed) and all(d.error is None for d in followed.values())
    # a link given as the INPUT itself is the user's own choice: read
    assert collect([str(docs / "secret.txt")])[0].text == "SECRET elsewhere"


def test_the_cli_passes_follow_links(monkeypatch, tmp_path):
    from summarize import cli, inputs

    seen, sizes = [], []

    def spy(paths, exclude=(), follow_links=False, max_file_bytes=None):
        seen.append(follow_links)
        sizes.append(max_file_bytes)
        return []

    monkeypatch.setattr(inputs, "collect", spy)
    for flag, expected in (([], False), (["--follow-links"], True)):
        assert cli.main([str(tmp_path), "--out", str(tmp_path / "r.jsonl"), *flag]) == 2  # no documents
        assert seen[-1] is expected
    assert sizes[-1] == inputs.MAX_FILE_BYTES
    assert cli.main([str(tmp_path), "--out", str(tmp_path / "r.jsonl"), "--max-file-bytes", "4096"]) == 2
    assert sizes[-1] == 4096


def _collect_within(seconds: float, *args, **kwargs):
    """collect() in a thread, so a read that blocks (a FIFO) fails the test instead of hanging it."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(collect(*args, **kwargs)), daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"collect() did not return within {seconds}s"
    return out[0]


def test_only_regular_files_are_read_a_fifo_or_a_device_fails_saying_why(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a document", encoding="utf-8")
    os.mkfifo(docs / "pipe.txt")  # nobody writes: reading it would block forever
    (docs / "zero.txt").symlink_to("/dev/zero")  # endless: reading it would fill the memory
    found = {os.path.basename(d.doc): d for d in _collect_within(10, [str(docs)], follow_links=True)}
    assert found["a.txt"].text == "a document"
    assert found["pipe.txt"].error["code"] == "not_a_regular_file" and "FIFO" in found["pipe.txt"].error["message"]
    assert found["zero.txt"].error["code"] == "not_a_regular_file" and "device" in found["zero.txt"].error["message"]
    # given as the INPUT itself, the same
    assert _collect_within(10, [str(docs / "pipe.txt")])[0].error["code"] == "not_a_regular_file"


def test_a_file_past_the_size_cap_is_not_read(tmp_path):
    (tmp_path / "big.txt").write_text("x" * 5000, encoding="utf-8")
    (tmp_path / "big.jsonl").write_text(json.dumps({"id": "r", "text": "y" * 5000}) + "\n", encoding="utf-8")
    (tmp_path / "small.txt").write_text("small", encoding="utf-8")
    found = {os.path.basename(d.doc): d for d in collect([str(tmp_path)], max_file_bytes=1000)}
    for name in ("big.txt", "big.jsonl"):
        assert found[name].text is None and found[name].error["code"] == "file_too_large", found[name]
        assert "more than --max-file-bytes (1,000)" in found[name].error["message"]
    assert found["small.txt"].text == "small"


def test_a_file_that_changes_while_it_is_read_is_reported(tmp_path, monkeypatch):
    path = tmp_path / "growing.log"
    path.write_text("first line\n", encoding="utf-8")
    real = inputs._read_bounded

    def read_then_append(f, limit):
        data = real(f, limit)
        with open(path, "a", encoding="utf-8") as other:  # another program writes meanwhile
            other.write("second line\n")
        return data

    monkeypatch.setattr(inputs, "_read_bounded", read_then_append)
    doc = collect([str(path)])[0]
    assert doc.text is None and doc.error["code"] == "changed_while_read" and doc.error["retryable"] is True


HOSTILE = ["evil\x1b[2J\x1b[H.txt", "x.txt\nsummarize: 9 of 9 documents finished", "a|b ## [x](javascript:alert(1))"
           "<img src=x onerror=alert(1)>.md", "rtl\u202etxt.exe", "line\u2028break.txt"]


def test_names_are_escaped_on_the_console_and_in_the_report():
    from summarize.inputs import Document
    from summarize.report import closing_summary, markdown_report
    from summarize.runner import RunStats, done_message

    docs = [Document(name, name, f"sha{i}", text="t") for i, name in enumerate(HOSTILE)]
    lines = {}
    for i, d in enumerate(docs):
        failed = i % 2 == 0
        lines[d.key] = {"doc": d.doc, "status": "failed" if failed else "ok", "summary": None if failed else "fine",
                        "chunks": 1, "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                        "error": {"code": "unreadable", "message": f"cannot read {d.doc}"} if failed else None}
    stats = RunStats(total=len(docs))
    console = [done_message(line) for line in lines.values()]
    console.append(closing_summary(stats, "local", "r.jsonl", "report.md",
                                   [line for line in lines.values() if line["status"] == "failed"]))
    for text in console:
        assert not any(c in text for c in "\x1b\u202e\u2028"), text
    assert all("\n" not in message for message in console[:-1])
    assert not any(line.startswith("summarize: 9 of 9") for line in console[-1].split("\n")[1:])
    report = markdown_report(docs, lines, stats, "local")
    assert not any(c in report for c in "\x1b\u202e\u2028")
    body = report.split("\n")
    assert "summarize: 9 of 9 documents finished" not in [line.strip() for line in body]
    assert not any(line.startswith("## ") and "\n" in line for line in body)
    assert not re.search(r"(?<!\\)<img|(?<!\\)\]\(javascript", report)  # escaped: shown as text
    table = [line for line in body if line.startswith("| ") and "sha" not in line][2:]
    assert all(line.count(" | ") == 4 for line in table), table  # five cells each, whatever the name
