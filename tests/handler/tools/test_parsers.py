"""The output parsers: tool calls per family (hermes, llama3_json, mistral), reasoning
(qwen3, deepseek_r1), and a message streamed in any pieces parsing as it does whole."""
import json
import random

import pytest

from handler.tools.message import MessageParser
from handler.tools.reasoning import split_reasoning
from handler.tools.tool_calls import detect_parser, tool_parser


def calls_of(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("name, text, content, calls", [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>{"name": "time", "arguments": "{\\"tz\\": \\"CET\\"}"}</tool_call>',
     "Let me check.\n", [("weather", {"city": "Paris"}), ("time", {"tz": "CET"})]),
    ("hermes", '<tool_call>{"name": "f", "arguments": {}}', None, [("f", {})]),  # unterminated last block
    ("hermes", 'text <tool_call>{"name": broken}</tool_call>', 'text <tool_call>{"name": broken}</tool_call>', []),
    ("llama3_json", ' {"name": "weather", "parameters": {"city": "Oslo"}}; {"name": "f", "parameters": {}}',
     None, [("weather", {"city": "Oslo"}), ("f", {})]),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"x": 1}}', None, [("f", {"x": 1})]),
    ("llama3_json", 'The answer is {"a": 1}', 'The answer is {"a": 1}', []),
    ("mistral", 'ok [TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]',
     "ok ", [("f", {"x": 1}), ("g", {})]),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}', None, [("f", {"x": 1}), ("g", {})]),
])
def test_tool_call_parsers(name, text, content, calls):
    got_content, got = tool_parser(name).parse(text)
    assert got_content == content and calls_of(got) == calls
    assert all(c.id.startswith("call_") for c in got) and len({c.id for c in got}) == len(got)


def test_parser_detected_from_the_template():
    assert detect_parser("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert detect_parser("[AVAILABLE_TOOLS] [TOOL_CALLS]") == "mistral"
    assert detect_parser("Environment: ipython <|python_tag|>") == "llama3_json"
    assert detect_parser("{{ messages }}") is None


@pytest.mark.parametrize("name, text, reasoning, content", [
    ("qwen3", "<think>\nstep 1\n</think>\n\nParis.", "\nstep 1\n", "\n\nParis."),
    ("qwen3", "Paris.", None, "Paris."),  # no <think>: all content
    ("qwen3", "<think>cut short", "cut short", ""),
    ("deepseek_r1", "step 1</think>Paris.", "step 1", "Paris."),  # <think> was in the prompt
    ("deepseek_r1", "<think>a</think>b", "a", "b"),
    ("deepseek_r1", "still thinking", "still thinking", ""),
])
def test_reasoning_split(name, text, reasoning, content):
    assert split_reasoning(name, text) == (reasoning, content)


TEXTS = [
    '<think>hmm <tool</think>\n\nSure. <tool_call>\n{"name": "get", "arguments": {"a": "<"}}\n</tool_call>',
    "plain text with < and <tool but no call", "<think>unfinished thought", "<thi", "  ",
    'x <tool_call>{bad json</tool_call>', '<tool_call>{"name": "x", "arguments": {}}</tool_call> trailing',
    ' {"name": "f", "parameters": {"q": 1}}', "{not a call", '[TOOL_CALLS][{"name": "f", "arguments": {}}]',
]


@pytest.mark.parametrize("reasoning", [None, "qwen3", "deepseek_r1"])
@pytest.mark.parametrize("tools", [None, "hermes", "llama3_json", "mistral"])
def test_streamed_pieces_parse_as_the_whole(reasoning, tools):
    rng = random.Random(0)
    for text in TEXTS:
        want_reasoning, want_content, want_calls = MessageParser(reasoning, tools).parse(text)
        for _ in range(15):
            parser, got_reasoning, got_content, i = MessageParser(reasoning, tools), "", "", 0
            while i < len(text):
                j = i + rng.randint(1, 6)
                r, c = parser.feed(text[i:j])
                got_reasoning, got_content, i = got_reasoning + r, got_content + c, j
            r, c, calls = parser.finish()
            assert (got_reasoning + r or None) == want_reasoning, text
            assert (got_content + c or None) == (want_content or None), text
            assert calls_of(calls) == calls_of(want_calls), text


def test_held_back_text_is_only_what_may_open_a_call():
    parser = MessageParser(None, "hermes")
    assert parser.feed("Hello <to") == ("", "Hello ")
    assert parser.feed("day") == ("", "<today")
    parser = MessageParser(None, "hermes", max_calls=1)
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert calls_of(parser.parse(text)[2]) == [("a", {})]  # parallel_tool_calls false: the first only
