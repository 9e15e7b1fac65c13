"""speculative_config: vLLM's keys and defaults, refusals naming the field, and the ways in
(EngineConfig, LLM)."""
import pytest
import torch

from engine import EngineConfig, LLM, SamplingParams
from engine.errors import InvalidInputError
from engine.spec_decode.config import CPU_BF16_DISABLE_BY_BATCH_SIZE, DEFAULT_DISABLE_BY_BATCH_SIZE, SpeculativeConfig


def test_vllm_keys_and_defaults():
    c = SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
                                      "prompt_lookup_min": 2})
    assert (c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == (5, 4, 2)
    assert c.disable_by_batch_size is None and not c.opt_in  # the engine's default, by device and dtype
    assert SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 3,
                                         "prompt_lookup_max": 1}).prompt_lookup_min == 1
    assert SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 3,
                                         "prompt_lookup_min": 6}).prompt_lookup_max == 6
    assert SpeculativeConfig.from_value(None) is None
    draft = {"method": "draft_model", "model": "d", "num_speculative_tokens": 5, "draft_tensor_parallel_size": 1}
    assert SpeculativeConfig.from_value(draft).draft_tensor_parallel_size == 1  # vLLM's documented example


@pytest.mark.parametrize("value,field", [
    ({"num_speculative_tokens": 4}, "speculative_config.method"),
    ({"method": "eagle", "num_speculative_tokens": 4}, "speculative_config.method"),
    ({"method": "ngram"}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": True}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 3},
     "speculative_config.prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 0},
     "speculative_config.disable_by_batch_size"),
    ({"method": "ngram", "num_speculative_tokens": 4, "min_acceptance_rate": 2},
     "speculative_config.min_acceptance_rate"),
    ({"method": "draft_model", "model": "d", "num_speculative_tokens": 4, "draft_tensor_parallel_size": 2},
     "speculative_config.draft_tensor_parallel_size"),
    ({"method": "ngram", "num_speculative_tokens": 4, "draft_model_revision": "main"},
     "speculative_config.draft_model_revision"),
    ("ngram", "speculative_config"),
])
def test_refusals_name_the_field(value, field):
    with pytest.raises(InvalidInputError) as err:
        EngineConfig(model="m", speculative_config=value)
    assert err.value.field == field and field in str(err.value)


def test_llm_takes_it_and_requests_opt_in_or_out(tiny_llama_dir):
    cfg = {"method": "ngram", "num_speculative_tokens": 3, "opt_in": True}
    llm = LLM(tiny_llama_dir, num_kv_blocks=64, speculative_config=cfg)
    spec = llm.engine.speculator
    assert spec.config.num_speculative_tokens == 3
    seq = llm.engine.add_request("a", {"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=2, temperature=0))
    assert not spec.eligible(seq)  # opt_in: only requests asking for it
    seq = llm.engine.add_request("b", {"prompt_token_ids": [5, 6]},
                                 SamplingParams(max_tokens=2, temperature=0, speculative=True))
    assert spec.eligible(seq)
    with pytest.raises(InvalidInputError):
        SamplingParams(speculative="yes")


def test_the_batch_size_switch_defaults_to_the_crossover_where_the_engine_runs(tiny_llama_dir):
    """Unset, disable_by_batch_size is the crossover measured for the device and dtype (2 for
    bfloat16 on a CPU, 8 elsewhere); set, it is kept."""
    ngram = {"method": "ngram", "num_speculative_tokens": 4}
    c = SpeculativeConfig.from_value(ngram)
    assert c.for_engine("cpu", torch.bfloat16).disable_by_batch_size == CPU_BF16_DISABLE_BY_BATCH_SIZE == 2
    assert c.for_engine("cpu", torch.float32).disable_by_batch_size == DEFAULT_DISABLE_BY_BATCH_SIZE == 8
    assert c.for_engine("cuda:0", torch.bfloat16).disable_by_batch_size == DEFAULT_DISABLE_BY_BATCH_SIZE
    assert SpeculativeConfig.from_value({**ngram, "disable_by_batch_size": 16}).for_engine(
        "cpu", torch.bfloat16).disable_by_batch_size == 16
    for dtype, want in (("bfloat16", 2), ("float32", 8)):
        llm = LLM(tiny_llama_dir, num_kv_blocks=64, dtype=dtype, speculative_config=ngram)
        assert llm.engine.speculator.config.disable_by_batch_size == want
        running = [llm.engine.add_request(str(i), {"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=2))
                   for i in range(want + 1)]
        assert llm.engine.speculator.on_for(running[:want]) and not llm.engine.speculator.on_for(running)
