"""Logprobs and prompt_logprobs equal transformers' log-softmax (CPU, float32), in vLLM's
shape (token id -> Logprob(logprob, rank, decoded_token)); computed for the rows that ask,
also across prefill chunks and preemption."""
import math

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import InvalidInputError
from engine.logprobs import Logprob

PROMPT = "Meeting notes: the team agreed to ship the release on Friday after the review"


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, num_kv_blocks=256, block_size=16, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def _hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


def test_greedy_logprobs_equal_transformers_log_softmax(llm, hf):
    out = llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0, logprobs=5, ignore_eos=True))[0]
    comp = out.outputs[0]
    ref = _hf_logprobs(hf, out.prompt_token_ids + comp.token_ids)
    n = len(out.prompt_token_ids)
    tok = llm.get_tokenizer()
    assert len(comp.logprobs) == len(comp.token_ids) == 8
    for i, (token, lp) in enumerate(zip(comp.token_ids, comp.logprobs)):
        row = ref[n - 1 + i]
        assert token == int(row.argmax())  # greedy as transformers
        top = torch.topk(row, 5)
        assert list(lp)[:1] == [token] and set(top.indices.tolist()) <= set(lp)
        for t, entry in lp.items():
            assert isinstance(entry, Logprob)
            assert math.isclose(entry.logprob, float(row[t]), abs_tol=1e-4)
            assert entry.rank == int((row >= row[t]).sum())
            assert entry.decoded_token == tok.decode([t])
        assert lp[token].rank == 1
    assert math.isclose(comp.cumulative_logprob, sum(lp[t].logprob for t, lp in zip(comp.token_ids, comp.logprobs)),
                        rel_tol=1e-5)


def test_logprobs_are_raw_before_temperature_and_bias(llm, hf):
    """vLLM V1's default logprobs_mode (raw_logprobs): the model's distribution, whatever the
    penalties, bias or temperature that chose the token."""
    params = SamplingParams(max_tokens=4, temperature=0.5, seed=3, logprobs=0, ignore_eos=True,
                            repetition_penalty=1.5, logit_bias={7: 5.0})
    out = llm.generate([PROMPT], params)[0]
    comp = out.outputs[0]
    ref = _hf_logprobs(hf, out.prompt_token_ids + comp.token_ids)
    n = len(out.prompt_token_ids)
    for i, (token, lp) in enumerate(zip(comp.token_ids, comp.logprobs)):
        assert list(lp) == [token]  # logprobs=0: the sampled token only
        assert math.isclose(lp[token].logprob, float(ref[n - 1 + i, token]), abs_tol=1e-4)


@pytest.mark.parametrize("chunk", [None, 16])
def test_prompt_logprobs_equal_transformers(tiny_llama_dir, hf, chunk):
    """Every prompt token after the first, also when the prompt is prefilled in chunks."""
    llm = LLM(tiny_llama_dir, num_kv_blocks=256, block_size=16, dtype="float32", device="cpu",
              max_num_batched_tokens=chunk)
    ids = llm.get_tokenizer().encode(PROMPT * 2)
    assert chunk is None or len(ids) > chunk
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3))[0]
    ref = _hf_logprobs(hf, ids)
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    for pos in range(1, len(ids)):
        lp = out.prompt_logprobs[pos]
        row = ref[pos - 1]
        assert ids[pos] in lp and len(lp) in (3, 4)
        assert math.isclose(lp[ids[pos]].logprob, float(row[ids[pos]]), abs_tol=1e-4)
        assert lp[ids[pos]].rank == int((row >= row[ids[pos]]).sum())
        assert set(torch.topk(row, 3).indices.tolist()) <= set(lp)
    assert out.outputs[0].logprobs is None  # not asked


def test_prompt_logprobs_skip_the_prefix_cache(llm):
    """A cached prefix has no logits: a request asking prompt_logprobs computes its whole prompt."""
    ids = llm.get_tokenizer().encode(PROMPT * 3)
    llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1))
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert out.num_cached_tokens == 0 and len(out.prompt_logprobs) == len(ids)
    assert all(len(lp) == 1 for lp in out.prompt_logprobs[1:])


def test_requests_without_logprobs_get_none_in_a_mixed_batch(llm):
    outs = llm.generate([PROMPT, PROMPT + " again"], [SamplingParams(max_tokens=3, logprobs=2, temperature=0),
                                                      SamplingParams(max_tokens=3, temperature=0)])
    assert len(outs[0].outputs[0].logprobs) == 3 and outs[1].outputs[0].logprobs is None
    assert outs[0].prompt_logprobs is None and outs[1].prompt_logprobs is None


def test_max_logprobs_caps_the_request(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, num_kv_blocks=64, block_size=16, max_logprobs=4)
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(InvalidInputError) as err:
            llm.generate(["Hi"], SamplingParams(max_tokens=1, **{field: 5}))
        assert err.value.field == field and "4" in str(err.value)
    assert llm.generate(["Hi"], SamplingParams(max_tokens=1, logprobs=4))[0].outputs[0].logprobs
