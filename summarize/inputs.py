"""The documents of a summarize run: files, folders (recursively; links out of a folder only
with --follow-links) and JSONL files of {"id", "text"}, each read once and hashed; unreadable
ones carry the reason they fail. Only regular files are read (a FIFO would block, a device never
end), up to --max-file-bytes, and a file that changes while it is read is reported."""
from __future__ import annotations

import codecs
import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass

log = logging.getLogger("summarize")

BINARY_SNIFF_BYTES = 8192
MAX_FILE_BYTES = 256 * 1024 * 1024  # --max-file-bytes' default: far past any text a summary reads well


@dataclass(slots=True)
class Document:
    """One document: `doc` names it in the results (a path, or a JSONL record's id)."""

    doc: str
    source: str  # the file, or "file.jsonl:LINE" for a record
    sha256: str
    text: str | None = None
    error: dict | None = None  # why it cannot be summarized: {"code", "message", "retryable": False}

    @property
    def key(self) -> tuple[str, str]:
        return self.doc, self.sha256


class InputError(ValueError):
    """An INPUT argument that is not there: the run does not start."""


def _fail(code: str, message: str, retryable: bool = False) -> dict:
    return {"code": code, "message": message, "retryable": retryable}


def decode_text(data: bytes) -> tuple[str | None, dict | None]:
    """The text of a file's bytes, or why it is not text (empty, binary, undecodable)."""
    if not data:
        return None, _fail("empty_document", "the file is empty")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError as exc:
            return None, _fail("undecodable", f"not valid UTF-16 despite its byte-order mark: {exc.reason} "
                               f"at byte {exc.start}")
    elif b"\x00" in data[:BINARY_SNIFF_BYTES]:
        return None, _fail("binary_file", "a binary file (it contains NUL bytes), not text")
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            return None, _fail("undecodable", f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                               f"({exc.reason})")
    return _check_text(text)


def _check_text(text: str) -> tuple[str | None, dict | None]:
    if not text.strip():
        return None, _fail("empty_document", "the document has only whitespace")
    if "\x00" in text:
        return None, _fail("binary_file", "the text contains NUL characters")
    return text, None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _read_bounded(f, limit: int) -> bytes:
    """At most limit + 1 bytes of the open file (one more than allowed tells it is too large)."""
    return f.read(limit + 1)


def read_bytes(path: str, max_bytes: int = MAX_FILE_BYTES) -> tuple[bytes | None, dict | None]:
    """A regular file's bytes, or why they are not read: not a regular file (a FIFO, a device, a
    socket: checked on the open file, which is opened without blocking), larger than `max_bytes`,
    unreadable, or changed while it was read (retryable: a rerun reads it again)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        return None, _fail("unreadable", f"cannot read the file: {exc.strerror or exc}")
    with os.fdopen(fd, "rb") as f:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return None, _fail("not_a_regular_file", f"{_kind(before.st_mode)}, not a regular file: not read")
        too_large = _fail("file_too_large", f"{before.st_size:,} bytes, more than --max-file-bytes ({max_bytes:,})")
        if before.st_size > max_bytes:
            return None, too_large
        try:
            data = _read_bounded(f, max_bytes)
        except OSError as exc:
            return None, _fail("unreadable", f"cannot read the file: {exc.strerror or exc}")
        after = os.fstat(fd)
    if len(data) > max_bytes:
        return None, too_large
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns) or len(data) != after.st_size:
        return None, _fail("changed_while_read", f"the file changed while it was read ({before.st_size:,} bytes, "
                           f"then {after.st_size:,}): rerun when it is complete", retryable=True)
    return data, None


def read_file(path: str, max_bytes: int = MAX_FILE_BYTES) -> Document:
    data, error = read_bytes(path, max_bytes)
    if error is not None:
        return Document(path, path, "", error=error)
    text, error = decode_text(data)
    return Document(path, path, _sha(data), text, error)


def read_jsonl(path: str, max_bytes: int = MAX_FILE_BYTES) -> list[Document]:
    """One document per non-blank line; a bad line is a failed document named `path:LINE`."""
    data, error = read_bytes(path, max_bytes)
    if error is not None:
        return [Document(path, path, "", error=error)]
    raw_lines = data.splitlines()
    docs = []
    for n, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        where = f"{path}:{n}"
        sha = _sha(raw)
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            docs.append(Document(where, where, sha, error=_fail("bad_record", f"line {n} is not JSON: {exc}")))
            continue
        if not isinstance(record, dict):
            docs.append(Document(where, where, sha, error=_fail("bad_record", f"line {n} is not a JSON object")))
            continue
        rid = record.get("id")
        doc = str(rid) if isinstance(rid, (str, int)) and str(rid).strip() else where
        text = record.get("text")
        if not isinstance(text, str):
            docs.append(Document(doc, where, sha, error=_fail("bad_record", f'line {n} has no "text" string')))
            continue
        text, error = _check_text(text)
        docs.append(Document(doc, where, _sha(record["text"].encode("utf-8")), text, error))
    if not docs:
        docs.append(Document(path, path, _sha(b""), error=_fail("empty_document", "the JSONL file has no records")))
    return docs


def _inside(top: str, real: str) -> bool:
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _link_outside(path: str, real: str, folder: str) -> Document:
    return Document(path, path, "", error=_fail(
        "link_outside_folder", f"a symbolic link to {real}, outside the folder {folder}: not read "
        "(--follow-links reads it)"))


def _walk(folder: str, exclude: set[str], follow_links: bool) -> tuple[list[str], list[Document], int]:
    """Files under `folder`, sorted, hidden files and folders left out (and counted). A link that
    leads out of the folder is not read unless `follow_links`: it comes back as a failed document.
    Followed links never read a folder twice (a link back up ends there)."""
    top = os.path.realpath(folder)
    found, refused, hidden, seen = [], [], 0, {top}
    for root, dirs, files in os.walk(folder, followlinks=follow_links):
        hidden += sum(d.startswith(".") for d in dirs) + sum(f.startswith(".") for f in files)
        keep = []
        for name in sorted(d for d in dirs if not d.startswith(".")):
            path = os.path.join(root, name)
            real = os.path.realpath(path)
            if not follow_links:
                if os.path.islink(path) and not _inside(top, real):
                    refused.append(_link_outside(os.path.normpath(path), real, folder))
            elif real not in seen:
                seen.add(real)
                keep.append(name)
        dirs[:] = keep if follow_links else sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = os.path.normpath(os.path.join(root, name))
            real = os.path.realpath(path)
            if name.startswith(".") or real in exclude:
                continue
            if not follow_links and not _inside(top, real):
                refused.append(_link_outside(path, real, folder))
                continue
            found.append(path)
    return found, refused, hidden


def collect(inputs: list[str], exclude: list[str] = (), follow_links: bool = False,
            max_file_bytes: int = MAX_FILE_BYTES) -> list[Document]:
    """The documents of INPUT arguments, in order. `exclude`: files never read (the run's
    own results and report). In a folder, links out of it are failed documents unless
    `follow_links` (an INPUT argument that is itself a link is read). A file larger than
    `max_file_bytes` is a failed document. Raises InputError for an argument that does not exist."""
    skip = {os.path.realpath(p) for p in exclude if p}
    docs: list[Document] = []
    for arg in inputs:
        refused: list[Document] = []
        if os.path.isdir(arg):
            files, refused, hidden = _walk(arg, skip, follow_links)
            if hidden:
                log.info("%s: left out %d hidden files or folders", arg, hidden)
        elif os.path.exists(arg):
            files = [os.path.normpath(arg)]
        else:
            raise InputError(f"{arg}: no such file or folder")
        for path in files:
            docs.extend(read_jsonl(path, max_file_bytes) if path.endswith(".jsonl")
                        else [read_file(path, max_file_bytes)])
        docs.extend(refused)
    return _unique(docs)


def _unique(docs: list[Document]) -> list[Document]:
    """A name seen before (a repeated JSONL id, a file given twice) fails under a name of its own."""
    first: dict[str, str] = {}
    out = []
    for d in docs:
        if d.doc in first:
            if d.source == first[d.doc]:
                continue  # the same file given twice (e.g. a file and its folder): one document
            name = f"{d.doc} ({d.source})"
            d = Document(name, d.source, d.sha256,
                         error=_fail("duplicate_document", f"{d.doc!r} is already the name of {first[d.doc]}"))
        first[d.doc] = d.source
        out.append(d)
    return out
