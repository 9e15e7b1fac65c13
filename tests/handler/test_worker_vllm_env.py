"""worker-vllm's environment variables (tests/handler/worker_vllm_env.txt, from its README
and docs): each one, with a value worker-vllm accepts, passes our settings and engine config
checks, and is honoured (a setting of ours, or an alias) or noted at start as not applicable;
and a real start with all of them set serves a job on the tiny model."""
from pathlib import Path

import pytest

from handler.engine_setup import check_engine_settings
from handler.settings import SETTINGS_BY_NAME, load_settings
from handler.worker_vllm_env import ALIASES, NOT_APPLICABLE, start_notes, translate
from tests.handler.conftest import run, settings_for, text_of

FIXTURE = Path(__file__).with_name("worker_vllm_env.txt")


def variables() -> dict[str, str]:
    lines = [ln for ln in FIXTURE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


@pytest.mark.parametrize("name, value", sorted(variables().items()))
def test_each_variable_starts_and_is_accounted_for(name, value):
    settings = load_settings({name: value})
    check_engine_settings(settings)
    honoured = name in SETTINGS_BY_NAME or name in ALIASES
    notes = start_notes({name: value}, SETTINGS_BY_NAME)
    assert honoured or name in NOT_APPLICABLE, name
    if not honoured:
        assert any(note.startswith(name) for note in notes), notes


def test_values_worker_vllm_accepts_are_read_as_ours():
    s = load_settings({"MAX_MODEL_LEN": "auto", "DTYPE": "half", "DEFAULT_MIN_BATCH_SIZE": "2",
                       "DEFAULT_BATCH_SIZE_GROWTH_FACTOR": "1.5", "NUM_GPU_BLOCKS_OVERRIDE": "7",
                       "TOKENIZER": "tok", "REQUEST_TIMEOUT": "60", "QUANTIZATION": "bitsandbytes"})
    assert (s.max_model_len, s.dtype, s.min_batch_size, s.batch_size_growth_factor) == (None, "float16", 2, 1.5)
    assert (s.num_kv_blocks, s.tokenizer_name, s.job_timeout_s, s.quantization) == (7, "tok", 60.0, None)
    assert load_settings({"DTYPE": "float", "MIN_BATCH_SIZE": "3", "DEFAULT_MIN_BATCH_SIZE": "2"}).min_batch_size == 3
    notes = translate({"MAX_MODEL_LEN": "auto", "QUANTIZATION": "squeezellm"})[1]
    assert [n.split("=")[0] for n in notes] == ["MAX_MODEL_LEN", "QUANTIZATION"]
    assert any("granite" in n for n in start_notes({"TOOL_CALL_PARSER": "granite"}, SETTINGS_BY_NAME))


def test_bad_values_still_fail_naming_the_variable():
    from handler.settings import SettingsError

    for name, value in (("BLOCK_SIZE", "12"), ("MAX_MODEL_LEN", "many"), ("QUANTIZATION", "bogus")):
        with pytest.raises(SettingsError, match=name):
            load_settings({name: value})


def test_a_real_start_with_all_of_them(tiny_llama_dir, loop):
    from handler.worker import Worker

    env = {k: v for k, v in variables().items() if k not in ("MODEL_NAME", "TOKENIZER_NAME", "TOKENIZER", "HF_TOKEN",
                                                             "BASE_PATH", "QUANTIZATION", "NUM_GPU_BLOCKS_OVERRIDE",
                                                             "KV_CACHE_DTYPE")}
    # the model's own: worker-vllm's example names a hub model, a GPU cache type and an AWQ checkpoint
    worker = Worker(settings_for(tiny_llama_dir, **env))
    try:
        out = run(loop, worker, {"prompt": "Hello", "sampling_params": {"max_tokens": 4}})
        assert text_of(out)
        out = run(loop, worker, {"messages": [{"role": "user", "content": "Hi"}], "sampling_params": {"max_tokens": 3}})
        assert out["status"] == "COMPLETED" and out["output"]
    finally:
        loop.run_until_complete(worker.aclose())


def test_worker_vllm_output_format(make_worker, loop):
    worker = make_worker(OUTPUT_FORMAT="worker-vllm", DEFAULT_BATCH_SIZE="2", MIN_BATCH_SIZE="1")
    out = run(loop, worker, {"prompt": "Hello", "sampling_params": {"max_tokens": 6, "ignore_eos": True, "temperature": 0}})
    item = out["output"][0]
    assert out["status"] == "COMPLETED" and len(out["output"]) == 1
    assert item["usage"]["input"] > 0 and item["usage"]["output"] == 6 and isinstance(item["choices"][0]["tokens"][0], str)
    out = run(loop, worker, {"prompt": "Hello", "stream": True, "sampling_params": {"max_tokens": 6, "ignore_eos": True, "temperature": 0}})
    items = out["output"]
    assert len(items) > 1 and all(set(i) == {"choices", "usage"} for i in items)
    assert "".join(t for i in items for t in i["choices"][0]["tokens"]) == "".join(item["choices"][0]["tokens"])
    assert items[-1]["usage"]["output"] == 6


def test_worker_vllm_output_format_with_two_choices_and_logprobs(make_worker, loop):
    """n=2 (and logprobs asked): worker-vllm's items index the choices, each with its own tokens."""
    worker = make_worker(OUTPUT_FORMAT="worker-vllm")
    params = {"max_tokens": 5, "ignore_eos": True, "n": 2, "seed": 7, "temperature": 1.0, "logprobs": 1}
    whole = run(loop, worker, {"prompt": "Hello", "sampling_params": params})
    assert whole["status"] == "COMPLETED" and len(whole["output"]) == 1
    choices = whole["output"][0]["choices"]
    assert len(choices) == 2 and all(isinstance(t, str) for c in choices for t in c["tokens"])
    assert whole["output"][0]["usage"]["output"] == 10  # both choices' tokens
    streamed = run(loop, worker, {"prompt": "Hello", "stream": True, "sampling_params": params})
    items = streamed["output"]
    assert all(set(i) == {"choices", "usage"} and len(i["choices"]) == 2 for i in items)
    for k in range(2):  # the same seeds: each choice's streamed tokens join to its whole text
        assert "".join(t for i in items for t in i["choices"][k]["tokens"]) == choices[k]["tokens"][0]
