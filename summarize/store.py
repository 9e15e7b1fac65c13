"""The results JSONL of a summarize run: what earlier runs finished, one line appended
(flushed and fsynced) per finished document, and a lock against two runs on one file."""
from __future__ import annotations

import json
import logging
import os
import tempfile

log = logging.getLogger("summarize")

DONE = ("ok", "truncated")


class StoreError(RuntimeError):
    pass


def _key(line: dict) -> tuple[str, str]:
    return line.get("doc"), line.get("sha256")


class ResultStore:
    """Open with `open(docs)`: earlier lines of documents done are kept and reported as done;
    lines this run will replace (failed ones, documents whose content changed) are dropped
    from the file first, so that afterwards each document has exactly one line."""

    def __init__(self, path: str):
        self.path = path
        self._file = None
        self._lock = None

    def read(self) -> list[dict]:
        """The file's lines; a torn last line (the process was killed mid-write) is left out."""
        if not os.path.exists(self.path):
            return []
        lines = []
        with open(self.path, encoding="utf-8") as f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    line = json.loads(raw)
                except json.JSONDecodeError:
                    log.warning("%s:%d is not a complete JSON line; it is dropped", self.path, n)
                    continue
                if isinstance(line, dict) and "doc" in line:
                    lines.append(line)
        return lines

    def open(self, docs) -> dict[tuple[str, str], dict]:
        """Lock the file, rewrite it without the lines this run replaces; returns the done
        lines of `docs` by document key."""
        self._acquire()
        names = {d.doc for d in docs}
        keys = {d.key for d in docs}
        old = self.read()
        latest: dict[tuple[str, str], dict] = {}
        for line in old:
            latest[_key(line)] = line  # a later line of the same document wins
        keep = [line for line in latest.values()
                if line.get("doc") not in names or (_key(line) in keys and line.get("status") in DONE)]
        if len(keep) != len(old):
            self._rewrite(keep)
        self._file = open(self.path, "a", encoding="utf-8")
        return {_key(line): line for line in keep if _key(line) in keys}

    def append(self, line: dict) -> None:
        """Write one line and make it durable before returning."""
        assert self._file is not None, "open() first"
        self._file.write(json.dumps(line, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock is not None:
            self._lock.close()  # closing the descriptor releases the lock
            self._lock = None

    def _rewrite(self, lines: list[dict]) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".summarize-", suffix=".jsonl", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for line in lines:
                    f.write(json.dumps(line, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, os.stat(self.path).st_mode & 0o777)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _fsync_dir(folder)

    def _acquire(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return
        self._lock = open(os.path.join(folder, f".{os.path.basename(self.path)}.lock"), "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            self._lock = None
            raise StoreError(f"{self.path} is in use by another summarize run") from None


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` in one step (the report)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".summarize-", suffix=".md", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o666 & ~umask)
    os.replace(tmp, path)
