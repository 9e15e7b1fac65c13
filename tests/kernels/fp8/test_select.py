"""docs/kernels.md's FP8 table is the code's selection: for every row, at the ends and the middle
of its token range, in each of its devices, dtypes and scale layouts,
llm_kernels.fp8.select.candidates returns exactly the row's kernels; and the table leaves no step
out (every device, dtype, layout and token count up to 4096 falls in exactly one row)."""
import re
from pathlib import Path

import pytest
import torch

from llm_kernels.fp8.select import KERNELS, candidates

DOC = Path(__file__).resolve().parents[3] / "docs" / "kernels.md"
HEADER = "| device | activations | tokens | scales | kernels | why |"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEVICES = ("cuda-fp8", "cuda", "interpreter", "cpu")
LAYOUTS = ("scaled", "channel", "block", "host")
LAST = 4096  # "N+" ranges are checked up to here


def table() -> list[dict]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        devices, dtypes, tokens, layouts, kernels, _ = [c.strip() for c in line.strip("|").split("|")]
        lo, _, hi = tokens.partition("-")
        rows.append({"devices": re.findall(r"`([\w-]+)`", devices), "layouts": re.findall(r"`(\w+)`", layouts),
                     "dtypes": [DTYPES[d.strip()] for d in dtypes.split(",")],
                     "lo": int(lo.rstrip("+")), "hi": LAST if tokens.endswith("+") else int(hi or lo),
                     "kernels": tuple(re.findall(r"`(\w+)`", kernels)), "line": line})
    return rows


ROWS = table()


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['devices'][0]}-{r['layouts'][0]}-{r['lo']}" for r in ROWS])
def test_every_row_is_what_the_code_selects(row):
    assert set(row["devices"]) <= set(DEVICES) and set(row["layouts"]) <= set(LAYOUTS), row["line"]
    for device in row["devices"]:
        for layout in row["layouts"]:
            for dtype in row["dtypes"]:
                for m in sorted({row["lo"], (row["lo"] + row["hi"]) // 2, row["hi"]}):
                    got = candidates(device, dtype, m, layout)
                    assert got == row["kernels"], (device, layout, m, dtype, row["line"])


def test_the_table_covers_every_step_once():
    names = {k.name for k in KERNELS}
    assert {k for r in ROWS for k in r["kernels"]} == names  # no kernel undocumented, none invented
    for device in DEVICES:
        for layout in LAYOUTS:
            for dtype in DTYPES.values():
                for m in (1, 2, 16, 17, 64, 65, 128, 129, 256, 257, 512, 513, LAST):
                    hits = [r for r in ROWS if device in r["devices"] and layout in r["layouts"]
                            and dtype in r["dtypes"] and r["lo"] <= m <= r["hi"]]
                    assert len(hits) == 1, (device, layout, dtype, m, [h["line"] for h in hits])
