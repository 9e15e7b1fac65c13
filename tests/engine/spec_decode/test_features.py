"""Speculation keeps every request feature's meaning: stop strings, stop ids and EOS inside an
accepted run end the output where one token a step would have ended it; logprobs are those
of the same positions; logit_bias, penalties and min_tokens apply at every verified position;
n > 1, seeds and structured output (masks at every verified position); the batch-size switch
and the pause of a request whose drafts keep failing; asynchronous scheduling beside it."""
import json

import jsonschema
import pytest

from engine import LLM, SamplingParams
from tests.engine.spec_decode.oracle import use_oracle

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "disable_by_batch_size": 64}
PROMPTS = [list(range(5, 45)), [9, 8, 7, 6, 5, 9, 8, 7], [300, 200, 100] * 5, [42]]


@pytest.fixture(scope="module")
def plain(tiny_llama_dir):
    return LLM(tiny_llama_dir, num_kv_blocks=256, max_model_len=512)


@pytest.fixture(scope="module")
def spec(tiny_llama_dir):
    return LLM(tiny_llama_dir, num_kv_blocks=256, max_model_len=512, speculative_config=NGRAM)


def run(llm, params, prompts=PROMPTS):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert not llm.engine.requests and not llm.engine.scheduler.has_unfinished()
    return [o.outputs for o in outs]


def oracle_from(plain, monkeypatch, params, every=5, prompts=PROMPTS):
    """Oracle drafts from `plain`'s outputs of `params` (greedy; no stops: drafts run past them)."""
    refs = {tuple(p): o[0].token_ids for p, o in zip(prompts, run(plain, params, prompts))}
    use_oracle(monkeypatch, refs, 400, every)
    return refs


def same(a, b):
    for (x, *xs), (y, *ys) in zip(a, b):
        assert (x.token_ids, x.text, x.finish_reason, x.stop_reason) == (y.token_ids, y.text, y.finish_reason,
                                                                         y.stop_reason)
        assert len(xs) == len(ys)


def test_stops_and_eos_inside_an_accepted_run(plain, spec, monkeypatch):
    refs = oracle_from(plain, monkeypatch, SamplingParams(max_tokens=30, temperature=0), every=1000)
    ref = refs[tuple(PROMPTS[0])]
    tok = plain.get_tokenizer()
    stop_text = tok.decode(ref[9:11]).strip() or tok.decode(ref[9:12])
    for params in (SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[ref[6]]),
                   SamplingParams(max_tokens=30, temperature=0, stop=[stop_text]),
                   SamplingParams(max_tokens=30, temperature=0, stop=[stop_text], include_stop_str_in_output=True),
                   SamplingParams(max_tokens=13, temperature=0)):
        want, got = run(plain, params), run(spec, params)
        same(want, got)
        assert got[0][0].finish_reason == ("length" if params.max_tokens == 13 else "stop")
    # EOS (id 2 in the test tokenizer) drafted mid-run: the output ends at it
    eos = SamplingParams(max_tokens=30, temperature=0, logit_bias={2: 12.0}, min_tokens=3)
    refs = oracle_from(plain, monkeypatch, SamplingParams(max_tokens=30, temperature=0, logit_bias={2: 12.0},
                                                          min_tokens=3, ignore_eos=True), every=1000)
    want, got = run(plain, eos), run(spec, eos)
    same(want, got)
    assert any(o[0].finish_reason == "stop" and o[0].stop_reason is None and len(o[0].token_ids) < 30 for o in got)
    assert spec.stats()["spec_accepted_tokens"] > 0


def test_logprobs_bias_and_penalties_per_position(plain, spec, monkeypatch):
    for params in (SamplingParams(max_tokens=20, temperature=0, logprobs=3),
                   SamplingParams(max_tokens=20, temperature=0, logit_bias={17: 3.0, 40: -100}),
                   SamplingParams(max_tokens=20, temperature=0, frequency_penalty=0.5, presence_penalty=0.3),
                   SamplingParams(max_tokens=20, temperature=0, repetition_penalty=1.3, min_tokens=15),
                   SamplingParams(max_tokens=20, temperature=0, bad_words=["the"])):
        oracle_from(plain, monkeypatch, params)
        want, got = run(plain, params), run(spec, params)
        same(want, got)
        if params.logprobs:
            for (x,), (y,) in zip(want, got):
                assert y.cumulative_logprob == pytest.approx(x.cumulative_logprob, abs=1e-3)
                for a, b in zip(x.logprobs, y.logprobs):
                    assert a.keys() == b.keys()
                    for t in a:
                        assert b[t].logprob == pytest.approx(a[t].logprob, abs=1e-4)
                        assert b[t].rank == a[t].rank


def test_n_and_seeds(plain, spec, monkeypatch):
    oracle_from(plain, monkeypatch, SamplingParams(max_tokens=16, temperature=0))
    greedy = SamplingParams(max_tokens=16, temperature=0, n=2)
    same(run(plain, greedy), run(spec, greedy))
    # a seeded sampled request does not speculate: its output is the one without speculation
    seeded = SamplingParams(max_tokens=16, temperature=0.9, seed=11, n=3)
    same(run(plain, seeded), run(spec, seeded))
    # an unseeded sampled one does, and the engine's seed still makes a run reproducible
    sampled = SamplingParams(max_tokens=16, temperature=0.9, best_of=3, n=2, ignore_eos=True)
    before = spec.stats()["spec_draft_tokens"]
    first = run(spec, sampled)
    assert spec.stats()["spec_draft_tokens"] > before
    again = LLM(spec.engine.config.model, num_kv_blocks=256, max_model_len=512, speculative_config=NGRAM)
    same(first, run(again, sampled))
    for outs in first:
        assert len(outs) == 2 and all(len(c.token_ids) == 16 for c in outs)


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


def test_structured_output_masks_every_verified_position(plain, spec, monkeypatch):
    params = SamplingParams(max_tokens=200, temperature=0, structured_outputs={"json": PERSON})
    oracle_from(plain, monkeypatch, params, every=3)  # drafts the grammar refuses too
    before = spec.stats()["spec_accepted_tokens"]
    want, got = run(plain, params), run(spec, params)
    same(want, got)
    done = [c for (c,) in got if c.finish_reason == "stop"]  # a random model may write whitespace to the limit
    assert done
    for c in done:
        jsonschema.validate(json.loads(c.text), PERSON)
    assert spec.stats()["spec_accepted_tokens"] > before


def test_batch_size_switch_and_low_acceptance_pause(tiny_llama_dir, monkeypatch):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    off = LLM(tiny_llama_dir, num_kv_blocks=256, speculative_config={**NGRAM, "disable_by_batch_size": 3})
    refs = oracle_from(off, monkeypatch, params)
    run(off, params)  # four running requests: above the switch, no step drafts
    assert off.stats()["spec_draft_tokens"] == 0
    run(off, params, PROMPTS[:3])
    assert off.stats()["spec_accepted_tokens"] > 0

    def always_wrong(self, seq, k):
        m = seq.num_output_tokens
        return [(t + 1) % 400 for t in refs[tuple(seq.prompt_token_ids)][m:m + k]]

    monkeypatch.setattr("engine.spec_decode.speculator.Speculator.draft", always_wrong)
    cfg = {**NGRAM, "min_acceptance_rate": 0.5, "acceptance_window": 8}
    llm = LLM(tiny_llama_dir, num_kv_blocks=256, speculative_config=cfg)
    got = run(llm, params, PROMPTS[:1])
    stats = llm.stats()
    assert got[0][0].token_ids == refs[tuple(PROMPTS[0])]
    assert stats["spec_paused_requests"] == 2 and stats["spec_accepted_tokens"] == 0
    # 8 drafted in 2 steps, a pause of 8 steps, 8 more, then a pause of 16: the request's end
    assert stats["spec_draft_tokens"] == 16


def test_asynchronous_scheduling_beside_speculation(tiny_llama_dir, monkeypatch):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    base = LLM(tiny_llama_dir, num_kv_blocks=256, async_scheduling=True)
    refs = oracle_from(base, monkeypatch, params)
    llm = LLM(tiny_llama_dir, num_kv_blocks=256, async_scheduling=True,
              speculative_config={**NGRAM, "disable_by_batch_size": 2})
    got = run(llm, params)  # four requests: above the switch, steps run ahead
    assert [o[0].token_ids for o in got] == [refs[tuple(p)] for p in PROMPTS]
    assert llm.stats()["num_async_steps"] > 0
    got = run(llm, params, PROMPTS[:2])  # two: speculation, synchronous steps
    assert [o[0].token_ids for o in got] == [refs[tuple(p)] for p in PROMPTS[:2]]
    assert llm.stats()["spec_accepted_tokens"] > 0
