"""The chunks of a raw SSE stream item (RAW_OPENAI_OUTPUT's `data: {...}` text), as a client reads them."""
from __future__ import annotations

import json


def parse_sse(item: str) -> list[dict]:
    out = []
    for line in item.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: "):]))
    return out
