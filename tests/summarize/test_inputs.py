"""Reading documents for the summarize command, and Korean and Japanese text through the
token chunking the worker's map-reduce uses: every chunk whole characters of the source."""
from __future__ import annotations

import asyncio
import codecs
import os

import pytest

from handler.summarize import core
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

    seen = []

    def spy(paths, exclude=(), follow_links=False):
        seen.append(follow_links)
        return []

    monkeypatch.setattr(inputs, "collect", spy)
    for flag, expected in (([], False), (["--follow-links"], True)):
        assert cli.main([str(tmp_path), "--out", str(tmp_path / "r.jsonl"), *flag]) == 2  # no documents
        assert seen[-1] is expected
