"""A forced tool_choice's output read back as tool calls (handler.tools.forced_calls): whole
and streamed in pieces of every size, the streamed deltas (header first, then argument
fragments) join to exactly the whole reading; whitespace between JSON tokens is dropped,
inside strings kept; brackets and escaped quotes in strings are text."""
import json
import random

import pytest

from handler.tools.forced_calls import ForcedCallParser, ForcedCallStream, parse_forced

REQUIRED = [  # (output text, [(name, arguments)])
    ('[{"name": "weather", "parameters": {"city": "Paris"}}]', [("weather", '{"city":"Paris"}')]),
    ('[ {\n\t"name" : "a" ,  "parameters" :{ "s": "x } ] \\" {[ y", "n": [1, 2.5, {"z": null}]}} ,\r\n'
     '{"parameters": {"t": true}, "name": "b"} ]',  # parameters before the name, too
     [("a", '{"s":"x } ] \\" {[ y","n":[1,2.5,{"z":null}]}'), ("b", '{"t":true}')]),
    ('[{"name": "a", "parameters": 5}, {"name": "b\\u00e9", "parameters": "s}"}]', [("a", "5"), ("bé", '"s}"')]),
    ('[{"name":"a","parameters":{}}]', [("a", "{}")]),
]


def streamed(stream: ForcedCallStream, text: str, rng: random.Random) -> list[tuple[str, str]]:
    """Feed `text` in random pieces; the calls the deltas assemble to, checking their order."""
    calls: dict[int, list] = {}
    i = 0
    while i < len(text):
        n = rng.randint(1, 6)
        stream.feed(text[i:i + n])
        i += n
        for d in stream.deltas():
            if d["index"] not in calls:  # a call's first delta is its header
                assert d["id"].startswith("call_") and d["type"] == "function" and d["function"]["name"], d
                calls[d["index"]] = [d["function"]["name"], d["function"]["arguments"], d["id"]]
            else:
                assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}, d
                calls[d["index"]][1] += d["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return [(name, args) for name, args, _ in (calls[k] for k in sorted(calls))]


@pytest.mark.parametrize("text, calls", REQUIRED)
def test_required_whole_and_streamed_agree(text, calls):
    whole = [(c.name, c.arguments) for c in parse_forced(None, text)]
    assert whole == calls
    for name, args in whole:
        json.loads(args)
    rng = random.Random(0)
    for _ in range(30):
        assert streamed(ForcedCallStream(None), text, rng) == calls


def test_named_output_is_the_arguments_compacted():
    text = ' {"city" :\t"Pa ris" ,\n "days": [1 , 2], "q": "a\\"b"}'
    (call,) = parse_forced("weather", text)
    assert call.name == "weather" and call.arguments == '{"city":"Pa ris","days":[1,2],"q":"a\\"b"}'
    assert json.loads(call.arguments) == json.loads(text)
    rng = random.Random(1)
    for _ in range(30):
        stream = ForcedCallStream("weather")
        got = streamed(stream, text, rng)
        assert got == [("weather", call.arguments)]
    # the header comes before any argument is known (the name is)
    assert ForcedCallStream("w").deltas()[0]["function"] == {"name": "w", "arguments": ""}


def test_a_call_waits_for_its_name_and_a_cut_output_keeps_what_came():
    stream = ForcedCallStream(None)
    stream.feed('[{"parameters": {"a": 1')
    assert stream.deltas() == [] and stream.calls() == []  # no name yet: nothing to send
    stream.feed('}, "name": "f"}, {"name": "g')
    (first,) = stream.deltas()
    assert (first["index"], first["function"]) == (0, {"name": "f", "arguments": '{"a":1}'})
    assert [c.name for c in stream.calls()] == ["f"]  # "g" is not complete yet
    stream.feed('", "param')
    (second,) = stream.deltas()
    assert (second["index"], second["function"]) == (1, {"name": "g", "arguments": ""})
    stream.feed('eters": {"b": ')  # cut here (finish_reason "length")
    assert stream.deltas() == [{"index": 1, "function": {"arguments": '{"b":'}}]
    assert [(c.name, c.arguments) for c in stream.calls()] == [("f", '{"a":1}'), ("g", '{"b":')]


def test_the_message_parser_interface_gives_only_calls():
    parser = ForcedCallParser(None)
    assert parser.feed('[{"name": "f", ') == ("", "")
    assert parser.feed('"parameters": {}}]') == ("", "")
    reasoning, content, calls = parser.finish()
    assert (reasoning, content, [(c.name, c.arguments) for c in calls]) == ("", "", [("f", "{}")])
    assert parser.parse('{"x": 1}')[2] == []  # not an array of calls: none
    assert [(c.name, c.arguments) for c in ForcedCallParser("f").parse('{"x": 1}')[2]] == [("f", '{"x":1}')]
