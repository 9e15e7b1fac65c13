"""The tree speaks of the product, not of how it was made: no file git tracks (code, docs,
results, these tests) labels its text with a numbered work period or a numbered tracker item.
History belongs in CHANGELOG.md and in git. Skipped outside a git checkout."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# built from parts so that this file's own text does not match the pattern it checks
LABELS = ("session" + "s?", "issue")
PATTERN = re.compile(r"\b(?:" + "|".join(LABELS) + r") [0-9]", re.IGNORECASE)


def git_files() -> list[str]:
    """Files git tracks here, and new ones it would track (not ignored); [] outside a checkout."""
    if shutil.which("git") is None:
        return []
    run = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True)
    if run.returncode != 0:
        return []
    return sorted({name for name in run.stdout.decode("utf-8", "surrogateescape").split("\0") if name})


def matches(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every match in a text file; nothing for a binary or missing one."""
    try:
        data = path.read_bytes()
    except OSError:  # tracked but deleted in the working tree, or not a regular file
        return []
    if b"\0" in data:
        return []
    text = data.decode("utf-8", "replace")
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if PATTERN.search(line)]


def test_the_pattern_finds_what_it_should_and_not_itself():
    assert PATTERN.search("as measured in " + "Session" + " 12") and PATTERN.search("see " + "issue" + " 41")
    assert PATTERN.search("two " + "sessions" + " 3 and 4")
    assert not PATTERN.search("two sessions with ten users") and not PATTERN.search("no issues 4 u")
    assert not matches(Path(__file__))


def test_no_tracked_file_carries_development_history_labels():
    files = git_files()
    if not files:
        pytest.skip("not a git checkout (or git is missing)")
    found = [f"{name}:{n}: {line[:120]}" for name in files for n, line in matches(ROOT / name)]
    if found:
        pytest.fail(f"{len(found)} development-history labels (write them as CHANGELOG.md entries, or drop "
                    f"them):\n" + "\n".join(found), pytrace=False)
