"""docs/kernels.md's FP8 table is the code's selection: for every row, at the ends and the middle
of its token range, in each of its devices, dtypes and scale layouts,
llm_kernels.fp8.select.candidates returns exactly the row's kernels; and the table leaves no step
out (every device, dtype, layout and token count up to 4096 falls in exactly one row)."""
import pytest

from llm_kernels.fp8.select import KERNELS, candidates
from tests.kernels.selection_table import LAST, check_cover, check_row, read_table

ROWS = read_table("| device | activations | tokens | scales | kernels | why |")
DEVICES = ("cuda-fp8", "cuda", "interpreter", "cpu")
LAYOUTS = ("scaled", "channel", "block", "host")


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['devices'][0]}-{r['layouts'][0]}-{r['lo']}" for r in ROWS])
def test_every_row_is_what_the_code_selects(row):
    assert set(row["devices"]) <= set(DEVICES) and set(row["layouts"]) <= set(LAYOUTS), row["line"]
    check_row(row, candidates)


def test_the_table_covers_every_step_once():
    check_cover(ROWS, KERNELS, [(d, layout) for d in DEVICES for layout in LAYOUTS],
                (1, 2, 16, 17, 64, 65, 128, 129, 256, 257, 512, 513, LAST))
