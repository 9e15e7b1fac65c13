"""Structured output in the engine (engine.structured, llguidance): on a random model, whose
unconstrained text is noise, every constrained output matches its JSON schema, regex,
choice or grammar, greedy and sampled, batched with other requests, with n > 1, across
preemption; unconstrained requests in the same steps are unchanged; a spec that cannot
compile fails naming structured_outputs before anything is queued; logprobs stay raw."""
import json
import re

import jsonschema
import pytest

from engine import LLM, SamplingParams
from engine.errors import InvalidInputError

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        "boss": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/ref"}]},
    },
    "required": ["name", "age", "role", "tags", "boss"],
    "additionalProperties": False,
    "$defs": {"ref": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                      "additionalProperties": False}},
}
PROMPTS = ["Hello there", "the cat sat on the mat", {"prompt_token_ids": list(range(5, 45))}, "x"]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, num_kv_blocks=256, block_size=16, max_model_len=1024, allow_long_max_model_len=True)


def gen(llm, prompts, max_tokens=600, **kw) -> list:
    return [o.outputs for o in llm.generate(prompts, SamplingParams(max_tokens=max_tokens, **kw))]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_validate(llm, temperature):
    outs = gen(llm, PROMPTS, temperature=temperature, seed=7, structured_outputs={"json": PERSON})
    for (c,) in outs:
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), PERSON)
    assert not llm.engine.requests and not llm.engine.scheduler.has_unfinished()


def test_without_the_constraint_the_same_requests_are_not_json(llm):
    """The control: the random model's own text is no JSON document (so the test above shows the masks)."""
    for (c,) in gen(llm, PROMPTS, max_tokens=40, temperature=1.0, seed=7):
        with pytest.raises(ValueError):
            json.loads(c.text)


def test_json_object_regex_choice_and_grammar(llm):
    (obj,), = gen(llm, ["a"], temperature=1.0, seed=3, structured_outputs={"json_object": True})
    if obj.finish_reason == "stop":  # a free-form object may run long on a random model
        assert isinstance(json.loads(obj.text), dict)
    else:
        assert obj.text.startswith("{")
    for (c,) in gen(llm, PROMPTS, max_tokens=30, temperature=1.0, seed=1,
                    structured_outputs={"regex": r"[a-c]{3}-[0-9]{2}"}):
        assert re.fullmatch(r"[a-c]{3}-[0-9]{2}", c.text) and c.finish_reason == "stop", c.text
    choices = ["yes", "no", "maybe later"]
    texts = {c.text for (c,) in gen(llm, PROMPTS * 3, temperature=1.0, structured_outputs={"choice": choices})}
    assert texts <= set(choices) and len(texts) > 1
    lark = 'start: "x" ("y" | "z")+ "!"'
    for (c,) in gen(llm, PROMPTS, max_tokens=40, temperature=1.0, seed=2, structured_outputs={"grammar": lark}):
        assert re.fullmatch(r"x[yz]+!", c.text) or (c.finish_reason == "length" and re.fullmatch(r"x[yz]*", c.text))
    gbnf = 'root ::= "v" [0-9] [0-9]? "." [0-9]'
    for (c,) in gen(llm, PROMPTS, max_tokens=40, temperature=1.0, structured_outputs={"grammar": gbnf}):
        assert re.fullmatch(r"v[0-9]{1,2}\.[0-9]", c.text), c.text


def test_json_options_compact_whitespace_and_closed_objects(llm):
    loose = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a", "b"]}
    so = {"json": json.dumps(loose), "disable_any_whitespace": True, "disable_additional_properties": True}
    for (c,) in gen(llm, PROMPTS, temperature=1.0, seed=4, structured_outputs=so):
        doc = json.loads(c.text)
        assert set(doc) == {"a", "b"} and not re.search(r"\s", c.text), c.text
    so = {"json": {**loose, "additionalProperties": False}, "whitespace_pattern": r"[ ]?"}
    for (c,) in gen(llm, PROMPTS, temperature=1.0, seed=4, structured_outputs=so):
        json.loads(c.text)
        assert not re.search(r"[\t\r\n]|  ", c.text), c.text
    for (c,) in gen(llm, PROMPTS[:2], temperature=1.0, seed=4, structured_outputs={**so, "whitespace_pattern": ""}):
        assert json.loads(c.text) is not None and not re.search(r"\s", c.text), c.text


def test_unconstrained_requests_are_unchanged_beside_constrained_ones(llm):
    plain = SamplingParams(max_tokens=24, temperature=1.0, seed=5, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, plain)]
    mixed = llm.generate(PROMPTS * 2, [plain] * 4 + [SamplingParams(max_tokens=600, temperature=1.0, seed=i,
                                                                   structured_outputs={"json": PERSON})
                                                    for i in range(4)])
    assert [o.outputs[0].token_ids for o in mixed[:4]] == alone
    for o in mixed[4:]:
        jsonschema.validate(json.loads(o.outputs[0].text), PERSON)


def test_each_choice_of_n_has_its_own_grammar_state(llm):
    (out,) = llm.generate(["Hi"], SamplingParams(n=3, max_tokens=600, temperature=1.0, seed=9,
                                                 structured_outputs={"json": PERSON}))
    docs = [json.loads(c.text) for c in out.outputs]
    for doc in docs:
        jsonschema.validate(doc, PERSON)
    assert len({json.dumps(d) for d in docs}) > 1


def test_preempted_and_recomputed_requests_keep_their_grammar_state(tiny_llama_dir):
    small = LLM(tiny_llama_dir, num_kv_blocks=24, block_size=16, max_model_len=384)  # 384 KV tokens for 8 requests
    params = SamplingParams(max_tokens=300, temperature=1.0, seed=3,
                            structured_outputs={"json": PERSON, "disable_any_whitespace": True})
    outs = small.generate(PROMPTS * 2, params)
    assert small.engine.scheduler.stats()["num_preemptions"] > 0
    for o in outs:
        jsonschema.validate(json.loads(o.outputs[0].text), PERSON)


def test_the_grammar_ending_ends_the_request_even_before_min_tokens(llm):
    (c,), = gen(llm, ["Hi"], temperature=1.0, min_tokens=20, structured_outputs={"choice": ["done"]})
    assert c.text == "done" and c.finish_reason == "stop" and c.stop_reason is None


def test_stop_strings_still_stop_a_constrained_request(llm):
    (c,), = gen(llm, ["Hi"], temperature=0.0, stop=[","], structured_outputs={"json": PERSON})
    assert c.finish_reason == "stop" and c.stop_reason == "," and c.text.startswith("{") and "," not in c.text


# 200 anyOf branches of 40 optional pattern properties: it compiles, but llguidance's parser refuses
# the row of items the first branch token opens (2,000 at most), which used to fail mid-generation
BRANCHY = {"type": "object", "required": ["v"], "properties": {"v": {"anyOf": [
    {"type": "object", "properties": {f"p{j}": {"type": "string", "pattern": f"^[a-z]{{{i % 5 + 1}}}{j}x$"}
                                      for j in range(40)}} for i in range(200)]}}}


@pytest.mark.parametrize("so, says", [
    ({"json": {"type": "object", "properties": {"a": {"type": "foo"}}}}, "foo"),
    ({"regex": "a(b"}, "unclosed group"),
    ({"grammar": "start: undefined_rule"}, "undefined_rule"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"regex": "a", "choice": ["b"]}, "exactly one"),
    ({"jsn": {}}, "'jsn' is not supported"),
    ({"json": BRANCHY}, "too complex to enforce"),
])
def test_a_spec_that_cannot_compile_fails_naming_structured_outputs_before_queueing(llm, so, says):
    with pytest.raises(InvalidInputError) as err:
        llm.engine.add_request("bad", "Hello", SamplingParams(max_tokens=5, structured_outputs=so))
    assert err.value.field == "structured_outputs" and says in str(err.value), str(err.value)
    assert "bad" not in llm.engine.requests and not llm.engine.scheduler.has_unfinished()


def test_compiled_grammars_are_cached_per_spec(llm):
    grammars = llm.engine.input_processor.grammars
    a = grammars.compile(SamplingParams(structured_outputs={"json": PERSON}).structured_outputs)
    b = grammars.compile(SamplingParams(structured_outputs={"json": json.loads(json.dumps(PERSON))}).structured_outputs)
    c = grammars.compile(SamplingParams(structured_outputs={"json": PERSON, "disable_any_whitespace": True}).structured_outputs)
    assert a is b and a is not c


def test_logprobs_are_raw_and_masked_tokens_never_sampled(llm):
    """The sampled token's logprob is the model's own (before the mask), as vLLM's default;
    the mask alone decides which tokens may come (the allowed set of a choice's first token)."""
    tok = llm.get_tokenizer()
    choices = ["alpha", "beta"]
    firsts = {tok.encode(c, add_special_tokens=False)[0] for c in choices}
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    (c,), = gen(llm, [prompt], max_tokens=10, temperature=0.0, logprobs=3, structured_outputs={"choice": choices})
    assert c.token_ids[0] in firsts and c.text in choices
    (free,), = gen(llm, [prompt], max_tokens=1, temperature=0.0, logprobs=3)
    raw = free.logprobs[0]  # the unconstrained distribution of the first position
    assert c.logprobs[0][c.token_ids[0]].logprob <= max(lp.logprob for lp in raw.values()) + 1e-6
    top = {t for t, lp in c.logprobs[0].items() if lp.rank is not None and lp.rank <= 3}
    assert top >= {t for t, lp in raw.items() if lp.rank is not None and lp.rank <= 3}


def test_a_step_without_constrained_requests_computes_no_mask(llm, monkeypatch):
    seen = []
    real = llm.engine.sampler.sample
    monkeypatch.setattr(llm.engine.sampler, "sample",
                        lambda logits, seqs, *a, masks=None: seen.append(masks) or real(logits, seqs, *a, masks=masks))
    gen(llm, PROMPTS, max_tokens=4)
    assert seen and all(m is None for m in seen)
    gen(llm, PROMPTS[:1] * 2 + PROMPTS[1:], max_tokens=4, structured_outputs={"regex": "[a-z]+"})
    assert any(m is not None and len(m.rows) == 5 for m in seen)


def test_masks_are_computed_while_the_forward_runs(llm, monkeypatch):
    """The step's masks are begun before the forward is launched, on another thread: a forward
    that waits for the mask computation to start would wait forever if it ran after it."""
    import threading

    started, forwards, threads = threading.Event(), [], []
    real_fill, real_execute = llm.engine.masks.fill, llm.engine.runner.execute

    def fill(seqs):
        threads.append(threading.get_ident())
        started.set()
        return real_fill(seqs)

    def execute(*a, **k):
        constrained = any(s.matcher is not None for s, _ in a[0])
        forwards.append(started.wait(timeout=10) if constrained else None)
        started.clear()
        return real_execute(*a, **k)

    monkeypatch.setattr(llm.engine.masks, "fill", fill)
    monkeypatch.setattr(llm.engine.runner, "execute", execute)
    (c,), = gen(llm, ["Hello there"], max_tokens=40, structured_outputs={"regex": "[a-z]{1,8}"})
    assert re.fullmatch("[a-z]{1,8}", c.text)
    assert forwards and all(f is True for f in forwards if f is not None)
    assert threading.get_ident() not in threads
