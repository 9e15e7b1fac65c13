"""Stop strings: found in the detokenized text (also across token borders),
trimmed exactly, and held back while streaming so a partial match never leaks."""
from __future__ import annotations


class StopChecker:
    def __init__(self, stops: list[str], include_stop_str: bool = False):
        self.stops = list(stops)
        self.include = include_stop_str
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.cut: int | None = None
        self.scanned = 0

    def check(self, text: str) -> str | None:
        """The stop string that ends text now, or None."""
        if not self.stops or self.cut is not None:
            return None
        start = max(0, self.scanned - self.hold)
        best = None
        for s in self.stops:
            idx = text.find(s, start)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, s)
        self.scanned = len(text)
        if best is None:
            return None
        idx, s = best
        self.cut = idx + (len(s) if self.include else 0)
        return s

    def visible_text(self, text: str, finished: bool) -> str:
        if self.cut is not None:
            return text[: self.cut]
        if finished or not self.hold:
            return text
        return text[: max(0, len(text) - self.hold)]
