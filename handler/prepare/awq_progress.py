"""AutoAWQ's output as a user of the worker should see it: its import banner (a 14-line
"deprecated" DeprecationWarning) left out, and its layer-by-layer quantization reported
one line a layer with an estimate of the time left, not only as a `\\r` bar."""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

# The first words of the message AutoAWQ 0.2.9 warns with when it is imported (awq/__init__.py)
BANNER = r"\s*I have left this message as the final dev message"
LAYER_LOOP_DESC = "AWQ"  # AutoAWQ's `tqdm(range(len(self.modules)), desc="AWQ")`, one pass per layer


def import_awq():
    """`awq`, imported without its banner. Only that one message is dropped (when it would be
    shown: AutoAWQ's own `warnings.simplefilter("default", DeprecationWarning)` goes before any
    filter of ours), and that simplefilter is undone, so other packages' deprecations stay as
    quiet (or as loud) as they were."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):  # older versions print it
        show = warnings.showwarning

        def show_but_the_banner(message, category, filename, lineno, file=None, line=None):
            if not (issubclass(category, DeprecationWarning) and re.match(BANNER, str(message))):
                show(message, category, filename, lineno, file, line)

        warnings.showwarning = show_but_the_banner
        return importlib.import_module("awq")


def _minutes(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def layer_message(done: int, total: int, elapsed: float) -> str:
    """'AWQ layer 3 of 30 quantized (17 s a layer, about 7 min 39 s left)'."""
    per_layer = elapsed / done
    return (f"AWQ layer {done} of {total} quantized ({per_layer:.0f} s a layer, about "
            f"{_minutes(per_layer * (total - done))} left)")


class _LayerLoop:
    """Stands in for `tqdm` inside AutoAWQ's quantizer: the layer loop gets a bar (when stderr
    is a terminal) and a `report` call after each layer; any other loop is plain tqdm."""

    def __init__(self, report: Callable[[str], None]):
        from tqdm import tqdm

        self.tqdm = tqdm
        self.report = report

    def __call__(self, iterable=None, *args, desc: str | None = None, **kwargs):
        if desc != LAYER_LOOP_DESC:
            return self.tqdm(iterable, *args, desc=desc, **kwargs)
        return self._layers(list(iterable))

    def _layers(self, layers: list) -> Iterator:
        total, started = len(layers), time.monotonic()
        with self.tqdm(total=total, desc="AWQ layers", unit="layer", disable=None, file=sys.stderr) as bar:
            for done, layer in enumerate(layers):
                if done:
                    bar.update(1)
                    self.report(layer_message(done, total, time.monotonic() - started))
                yield layer
            if total:
                bar.update(1)
                self.report(layer_message(total, total, time.monotonic() - started))


@contextlib.contextmanager
def layer_progress(report: Callable[[str], None] | None) -> Iterator[None]:
    """Inside the block, AutoAWQ's quantization loop calls `report` after each layer."""
    quantizer = importlib.import_module("awq.quantize.quantizer")
    assert hasattr(quantizer, "tqdm"), "AutoAWQ changed; review layer_progress"
    original = quantizer.tqdm
    quantizer.tqdm = _LayerLoop(report or logger.info)
    try:
        yield
    finally:
        quantizer.tqdm = original
