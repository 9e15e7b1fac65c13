"""A draft model keeps every request feature's meaning (its drafts are the target's own greedy
tokens here, so runs are long): stops and EOS inside an accepted run, logprobs, n > 1, seeds,
structured output masks at every verified position; and a draft model that cannot
draft for the served model is refused at load, named."""
import json

import jsonschema
import pytest

from engine import LLM, EngineConfig, SamplingParams
from engine.errors import InvalidInputError, ModelLoadError
from tests import models

PROMPTS = [list(range(5, 45)), [9, 8, 7, 6, 5, 9, 8, 7], [300, 200, 100] * 5, [42]]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


def draft(model):
    return {"method": "draft_model", "model": model, "num_speculative_tokens": 4, "disable_by_batch_size": 64}


@pytest.fixture(scope="module")
def plain(tiny_llama_dir):
    return LLM(tiny_llama_dir, num_kv_blocks=256, max_model_len=512)


@pytest.fixture(scope="module")
def spec(tiny_llama_dir):
    return LLM(tiny_llama_dir, num_kv_blocks=256, max_model_len=512, speculative_config=draft(tiny_llama_dir))


def run(llm, params, prompts=PROMPTS):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert not llm.engine.requests and not llm.engine.scheduler.has_unfinished()
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs]


def test_stops_eos_logprobs_and_n(plain, spec):
    first = run(plain, SamplingParams(max_tokens=30, temperature=0))[0][0][0]
    stop_text = plain.get_tokenizer().decode(first[9:12])
    for params in (SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[first[6]]),
                   SamplingParams(max_tokens=30, temperature=0, stop=[stop_text]),
                   SamplingParams(max_tokens=30, temperature=0, logit_bias={2: 12.0}, min_tokens=3),
                   SamplingParams(max_tokens=13, temperature=0, n=2),
                   SamplingParams(max_tokens=16, temperature=0.9, seed=11, n=2)):
        assert run(spec, params) == run(plain, params), params
    before = spec.stats()["spec_accepted_tokens"]
    params = SamplingParams(max_tokens=20, temperature=0, logprobs=3)
    want = plain.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    got = spec.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for x, y in zip(want, got):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        for a, b in zip(x.outputs[0].logprobs, y.outputs[0].logprobs):
            assert a.keys() == b.keys() and all(b[t].logprob == pytest.approx(a[t].logprob, abs=1e-4) for t in a)
    assert spec.stats()["spec_accepted_tokens"] > before


def test_structured_output_under_a_draft_model(plain, tiny_llama_dir, ckpt_dir):
    """A random sibling drafts tokens the grammar refuses: the drafts are cut there."""
    small = models.make_checkpoint(str(ckpt_dir / "llama-draft"), "llama", seed=77, num_hidden_layers=1)
    spec = LLM(tiny_llama_dir, num_kv_blocks=256, max_model_len=512, speculative_config=draft(small))
    params = SamplingParams(max_tokens=200, temperature=0, structured_outputs={"json": PERSON})
    want, got = run(plain, params), run(spec, params)
    assert got == want
    done = [c for (c,) in got if c[2] == "stop"]
    assert done
    for c in done:
        jsonschema.validate(json.loads(c[1]), PERSON)
    assert spec.stats()["spec_draft_tokens"] > 0


def test_a_draft_model_must_share_the_tokenizer(tiny_llama_dir, tmp_path):
    other = models.make_checkpoint(str(tmp_path / "other"), "llama", seed=3, num_hidden_layers=1)
    models.make_tokenizer(vocab_size=300).save_pretrained(other)
    with pytest.raises(ModelLoadError, match="another vocabulary"):
        LLM(tiny_llama_dir, num_kv_blocks=64, speculative_config=draft(other))


@pytest.mark.parametrize("value, field", [
    ({"method": "draft_model", "num_speculative_tokens": 4}, "speculative_config.model"),
    ({"method": "draft_model", "model": "", "num_speculative_tokens": 4}, "speculative_config.model"),
    ({"method": "ngram", "model": "x", "num_speculative_tokens": 4}, "speculative_config.model"),
])
def test_draft_model_config_is_checked(value, field):
    with pytest.raises(InvalidInputError) as err:
        EngineConfig(model="m", speculative_config=value)
    assert err.value.field == field
