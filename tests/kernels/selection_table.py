"""docs/kernels.md's kernel tables as rows, for the tests that check them against the code's
ordered kernel lists (tests/kernels/w4a16/test_select.py, tests/kernels/fp8/test_select.py)."""
from __future__ import annotations

import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "kernels.md"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
LAST = 4096  # "N+" token ranges are checked up to here


def read_table(header: str) -> list[dict]:
    """The rows under `header`: devices, dtypes, token range [lo, hi], layouts, kernels, the line."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        devices, dtypes, tokens, layouts, kernels, _ = [c.strip() for c in line.strip("|").split("|")]
        lo, _, hi = tokens.partition("-")
        rows.append({"devices": re.findall(r"`([\w+-]+)`", devices), "layouts": re.findall(r"`([\w+-]+)`", layouts),
                     "dtypes": [DTYPES[d.strip()] for d in dtypes.split(",")],
                     "lo": int(lo.rstrip("+")), "hi": LAST if tokens.endswith("+") else int(hi or lo),
                     "kernels": tuple(re.findall(r"`(\w+)`", kernels)), "line": line})
    return rows


def check_row(row: dict, candidates) -> None:
    """candidates(device, dtype, m, layout) is the row's kernels at the ends and middle of its range."""
    for device in row["devices"]:
        for layout in row["layouts"]:
            for dtype in row["dtypes"]:
                for m in sorted({row["lo"], (row["lo"] + row["hi"]) // 2, row["hi"]}):
                    assert candidates(device, dtype, m, layout) == row["kernels"], (device, layout, m, dtype,
                                                                                   row["line"])


def check_cover(rows: list[dict], kernels, steps, ms) -> None:
    """Every kernel is in the table, and every (device, layout) of `steps`, dtype and token count
    of `ms` falls in exactly one row."""
    assert {k for r in rows for k in r["kernels"]} == {k.name for k in kernels}  # none undocumented, none invented
    for device, layout in steps:
        for dtype in DTYPES.values():
            for m in ms:
                hits = [r for r in rows if device in r["devices"] and layout in r["layouts"]
                        and dtype in r["dtypes"] and r["lo"] <= m <= r["hi"]]
                assert len(hits) == 1, (device, layout, dtype, m, [h["line"] for h in hits])
