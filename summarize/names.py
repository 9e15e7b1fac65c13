"""How text that the files control (their names, and messages that quote them) is shown: on
the console with control characters escaped (an ESC sequence cannot clear the terminal, a newline
cannot forge a line), in the Markdown report also with its syntax escaped (a name cannot add a
heading, a table cell, a link or HTML). The JSONL results keep the names exact (JSON escapes them)."""
from __future__ import annotations

import re

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the bidirectional
# overrides and isolates (which reorder how the rest of a line reads)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# ASCII punctuation that Markdown (CommonMark, GitHub's tables) may read as syntax: escaped with \
_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()#+!|~&])")


def _escape(match: re.Match) -> str:
    c = match.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def shown(text) -> str:
    """`text` for one console line: control characters escaped (`\\n`, `\\x1b`, `\\u202e`)."""
    return _CONTROL.sub(_escape, str(text))


def markdown(text) -> str:
    """`text` for Markdown inline content (a heading, a table cell, a paragraph): one line, its
    control characters and Markdown syntax escaped."""
    return _MARKDOWN.sub(r"\\\1", shown(text))
