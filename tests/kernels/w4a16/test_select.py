"""docs/kernels.md's W4A16 table is the code's selection: for every row, at the ends and the
middle of its token range and in each of its dtypes, llm_kernels.w4a16.select.candidates
returns exactly the row's kernels; and the table leaves no step out (every device, dtype,
layout and token count up to 4096 falls in exactly one row)."""
import pytest

from llm_kernels.w4a16.select import KERNELS, candidates
from tests.kernels.selection_table import LAST, check_cover, check_row, read_table

ROWS = read_table("| device | activations | tokens | layout | kernels | why |")


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['devices'][0]}-{r['layouts'][0]}-{r['lo']}" for r in ROWS])
def test_every_row_is_what_the_code_selects(row):
    check_row(row, candidates)


def test_the_table_covers_every_step_once():
    steps = [(d, layout) for d in ("cuda", "interpreter", "cpu") for layout in ("kpack", "checkpoint", "host+int4", "host")
             if d == "cpu" or not layout.startswith("host")]  # the host layouts are the CPU's
    check_cover(ROWS, KERNELS, steps, (1, 2, 16, 17, 64, 65, 256, 257, 512, 513, LAST))
