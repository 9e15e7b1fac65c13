"""Hardening suites (soak, faults, fuzzing, drain): CI runs them at a reduced size; set
HARDENING_FULL=1 for the full size. Each suite records its figures; they are printed at the
end of the run (and written as JSON to $HARDENING_REPORT when it is set)."""
from __future__ import annotations

import json
import os

import pytest

FULL = os.environ.get("HARDENING_FULL", "").strip() not in ("", "0")
FIGURES: dict[str, dict] = {}


def size(ci: int, full: int) -> int:
    """`full` with HARDENING_FULL=1, else `ci`."""
    return full if FULL else ci


class Figures:
    """What a suite measured: `set` values, `add` to counts."""

    @staticmethod
    def set(suite: str, **values) -> None:
        FIGURES.setdefault(suite, {"size": "full" if FULL else "ci"}).update(values)

    @staticmethod
    def add(suite: str, key: str, n: float = 1) -> None:
        entry = FIGURES.setdefault(suite, {"size": "full" if FULL else "ci"})
        entry[key] = entry.get(key, 0) + n


@pytest.fixture
def figures() -> Figures:
    return Figures()


def pytest_terminal_summary(terminalreporter):
    if not FIGURES:
        return
    terminalreporter.section("hardening figures")
    for suite, values in FIGURES.items():
        terminalreporter.write_line(f"{suite}: {json.dumps(values, sort_keys=True)}")
    path = os.environ.get("HARDENING_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(FIGURES, f, indent=2, sort_keys=True)
