"""worker-vllm's environment variables (tests/handler/worker_vllm_env.txt, from its README
and docs): each one, with a value worker-vllm accepts, is honoured (a setting of ours), mapped
(an alias or a value read as ours), noted at start as not applicable, or refused at start naming
the variable and what to do; a real start with all but the refused ones serves a job on the tiny
model; and a worker-vllm client's read of the native output."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from handler.engine_setup import check_engine_settings
from handler.settings import SETTINGS_BY_NAME, SettingsError, load_settings
from handler.worker_vllm_env import ALIASES, NOT_APPLICABLE, start_notes, translate
from handler.worker_vllm_names import HONOURED, MAPPED, NOTED, REFUSED, RULES
from tests.handler.conftest import run, settings_for, text_of

FIXTURE = Path(__file__).with_name("worker_vllm_env.txt")
REPO = Path(__file__).resolve().parents[2]
# the fixture's variables whose value asks for what this worker cannot do
REFUSED_IN_FIXTURE = {"VLLM_CONFIG_FILE", "TOOL_CALL_PARSER"}


def variables() -> dict[str, str]:
    lines = [ln for ln in FIXTURE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


@pytest.mark.parametrize("name, value", sorted(variables().items()))
def test_each_variable_is_accounted_for(name, value):
    """Alone, with worker-vllm's value: a rule says what happens, and it happens."""
    rule = RULES[name]
    if name in REFUSED_IN_FIXTURE:  # TOOL_CALL_PARSER=granite: with auto tool choice on (our default)
        with pytest.raises(SettingsError, match=f"^{name}="):
            load_settings({name: value})
        return
    settings = load_settings({name: value})
    check_engine_settings(settings)
    notes = start_notes({name: value}, SETTINGS_BY_NAME)
    if rule.kind == NOTED:
        assert name in NOT_APPLICABLE and any(note.startswith(name) for note in notes), notes
    elif rule.kind == REFUSED:  # a value that asks for nothing (RETURN_TOKENS_AS_TOKEN_IDS=false): as unset
        assert rule.refused_if is not None and not rule.refused_if(value, {name: value})
    else:
        assert rule.kind in (HONOURED, MAPPED), rule
        assert name in SETTINGS_BY_NAME or name in ALIASES or name in ("VLLM_EXTRA_ARGS", "PYTORCH_ALLOC_CONF")


def test_the_rules_name_our_settings():
    """Honoured names are settings of ours; aliases lead to one."""
    honoured = {n for n, r in RULES.items() if r.kind == HONOURED} - {"PYTORCH_ALLOC_CONF"}
    assert honoured <= set(SETTINGS_BY_NAME), honoured - set(SETTINGS_BY_NAME)
    assert set(ALIASES.values()) <= set(SETTINGS_BY_NAME) | {"MODEL_NAME"}
    assert not {n for n, r in RULES.items() if r.kind in (NOTED, REFUSED)} & set(SETTINGS_BY_NAME)
    assert all(r.refusal for r in RULES.values() if r.refused_if is not None)


def test_honoured_mapped_and_noted_through_the_start_path():
    # honoured: our setting of the same name
    s = load_settings({"MAX_NUM_SEQS": "64", "ENABLE_PREFIX_CACHING": "false", "KV_CACHE_DTYPE": "fp8"})
    assert (s.max_num_seqs, s.enable_prefix_caching, s.kv_cache_dtype) == (64, False, "fp8")
    check_engine_settings(s)
    # mapped: an alias, or a value read as ours
    s = load_settings({"REVISION": "v2", "RESPONSE_ROLE": "bot", "MAX_NUM_BATCHED_TOKENS": "0",
                       "SERVED_MODEL_NAME": "mine", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert s.allow_long_max_model_len is True
    assert (s.model_revision, s.openai_response_role, s.max_num_batched_tokens) == ("v2", "bot", None)
    assert s.openai_served_model_name_override == "mine"
    # noted: logged once at start, the worker starts
    check_engine_settings(load_settings({"ATTENTION_BACKEND": "FLASHINFER", "LORA_DTYPE": "auto"}))
    notes = start_notes({"ATTENTION_BACKEND": "FLASHINFER", "LORA_DTYPE": "auto"}, SETTINGS_BY_NAME)
    assert [n.split(" ")[0] for n in notes] == ["ATTENTION_BACKEND", "LORA_DTYPE"]
    # LoRA: honoured (handler.lora; tests/handler/lora)
    s = load_settings({"ENABLE_LORA": "true", "MAX_LORAS": "2", "MAX_LORA_RANK": "32", "MAX_CPU_LORAS": "4",
                       "LORA_MODULES": '[{"name": "my-adapter", "path": "org/adapter-repo"}]'})
    assert (s.enable_lora, s.max_loras, s.max_lora_rank, s.max_cpu_loras) == (True, 2, 32, 4)
    assert [(m.name, m.path, m.lora_int_id) for m in s.lora_modules] == [("my-adapter", "org/adapter-repo", 1)]
    check_engine_settings(s)
    # values of a refused variable that ask for nothing start as without it
    for env in ({"LIMIT_MM_PER_PROMPT": '{"image": 0}'},
                {"LIMIT_MM_PER_PROMPT": "image=0,video=0"}, {"RUNNER": "generate"},
                {"TOOL_CALL_PARSER": "granite", "ENABLE_AUTO_TOOL_CHOICE": "false"}):
        check_engine_settings(load_settings(env))


@pytest.mark.parametrize("env, named", [
    ({"DEFAULT_MM_LORAS": '{"image": "org/a"}'}, "DEFAULT_MM_LORAS"),
    ({"LIMIT_MM_PER_PROMPT": '{"image": 2}'}, "LIMIT_MM_PER_PROMPT"),
    ({"LIMIT_MM_PER_PROMPT": "image=1"}, "LIMIT_MM_PER_PROMPT"),
    ({"REASONING_PARSER": "granite"}, "REASONING_PARSER"),
    ({"TOOL_CALL_PARSER": "pythonic", "ENABLE_AUTO_TOOL_CHOICE": "true"}, "TOOL_CALL_PARSER"),
    ({"OVERRIDE_GENERATION_CONFIG": '{"temperature": 0.2}'}, "OVERRIDE_GENERATION_CONFIG"),
    ({"VLLM_EXTRA_ARGS": "--max-num-seqs 8 --enable-prompt-embeds"}, "VLLM_EXTRA_ARGS"),
    ({"VLLM_EXTRA_ARGS": "--limit-mm-per-prompt '{\"image\": 1}'"}, "VLLM_EXTRA_ARGS"),
])
def test_refused_variables_stop_the_start_naming_them(env, named):
    with pytest.raises(SettingsError, match=f"^{named}=") as info:
        load_settings(env)
    assert "unset it" in str(info.value) or "remove it" in str(info.value) or "set one of" in str(info.value)


def test_a_refused_variable_exits_2_at_start_as_a_bad_setting_does():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}
    for extra, shown in (({"ENABLE_PROMPT_EMBEDS": "true"}, "invalid setting: ENABLE_PROMPT_EMBEDS='true': prompt"),
                         ({"VLLM_EXTRA_ARGS": "--enable-prompt-embeds"}, "VLLM_EXTRA_ARGS='--enable-prompt-embeds': "
                          "--enable-prompt-embeds (as ENABLE_PROMPT_EMBEDS=true)")):
        p = subprocess.run([sys.executable, "-m", "handler", "--test_input", '{"input": {"prompt": "Hi"}}'],
                           env={**env, "PYTHONPATH": str(REPO), **extra}, cwd=REPO, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2 and shown in p.stderr and p.stdout == "", p.stderr[-2000:]
        assert "Traceback" not in p.stderr


def test_vllm_extra_args_flags_are_read_as_their_variables():
    s = load_settings({"MAX_NUM_SEQS": "32", "VLLM_EXTRA_ARGS": "--max-num-seqs 64 --enforce-eager "
                       "--no-enable-prefix-caching --max-model-len=auto --dtype half -tp 1 --model org/m "
                       "--port 9000 --uvicorn-log-level warning"})
    assert (s.max_num_seqs, s.enforce_eager, s.enable_prefix_caching) == (64, True, False)  # the flags win
    assert (s.max_model_len, s.dtype, s.tensor_parallel_size, s.model_name) == (None, "float16", 1, "org/m")
    assert s.port == 80  # vllm serve's --port is not the load-balancing PORT
    notes = start_notes({"VLLM_EXTRA_ARGS": "--port 9000 --uvicorn-log-level warning"}, SETTINGS_BY_NAME)
    assert [n.split(" (")[0] for n in notes] == ["VLLM_EXTRA_ARGS --port", "VLLM_EXTRA_ARGS --uvicorn-log-level"]


def test_values_worker_vllm_accepts_are_read_as_ours():
    s = load_settings({"MAX_MODEL_LEN": "auto", "DTYPE": "half", "DEFAULT_MIN_BATCH_SIZE": "2",
                       "DEFAULT_BATCH_SIZE_GROWTH_FACTOR": "1.5", "NUM_GPU_BLOCKS_OVERRIDE": "7",
                       "TOKENIZER": "tok", "REQUEST_TIMEOUT": "60", "QUANTIZATION": "bitsandbytes"})
    assert (s.max_model_len, s.dtype, s.min_batch_size, s.batch_size_growth_factor) == (None, "float16", 2, 1.5)
    assert (s.num_kv_blocks, s.tokenizer_name, s.job_timeout_s, s.quantization) == (7, "tok", 60.0, None)
    assert load_settings({"DTYPE": "float", "MIN_BATCH_SIZE": "3", "DEFAULT_MIN_BATCH_SIZE": "2"}).min_batch_size == 3
    notes = translate({"MAX_MODEL_LEN": "auto", "QUANTIZATION": "squeezellm"})[1]
    assert [n.split("=")[0] for n in notes] == ["MAX_MODEL_LEN", "QUANTIZATION"]
    notes = start_notes({"TOOL_CALL_PARSER": "granite", "ENABLE_AUTO_TOOL_CHOICE": "false"}, SETTINGS_BY_NAME)
    assert any("granite" in n for n in notes)


def test_bad_values_still_fail_naming_the_variable():
    for name, value in (("BLOCK_SIZE", "12"), ("MAX_MODEL_LEN", "many"), ("QUANTIZATION", "bogus")):
        with pytest.raises(SettingsError, match=name):
            load_settings({name: value})


def test_a_real_start_with_all_but_the_refused_ones(tiny_llama_dir, loop):
    from handler.worker import Worker

    env = {k: v for k, v in variables().items() if k not in ("MODEL_NAME", "TOKENIZER_NAME", "TOKENIZER", "HF_TOKEN",
                                                             "BASE_PATH", "QUANTIZATION", "NUM_GPU_BLOCKS_OVERRIDE",
                                                             "KV_CACHE_DTYPE", "LORA_MODULES",
                                                             "VLLM_CONFIG_FILE")}
    # the model's own: worker-vllm's example names a hub model, a hub adapter (LORA_MODULES: its own
    # tests in tests/handler/lora), a GPU cache type and an AWQ checkpoint; ENABLE_LORA with no adapter;
    # TOOL_CALL_PARSER=granite starts because the fixture's ENABLE_AUTO_TOOL_CHOICE is false
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


def worker_vllm_client(output: list) -> str:
    """What a client of worker-vllm's native (non-OpenAI) jobs reads, unchanged."""
    return "".join(output[0]["choices"][0]["tokens"])


def test_a_worker_vllm_client_reads_the_output_with_output_format_worker_vllm(make_worker, loop):
    """The default items are ours (`text`, ...): worker-vllm's client code needs OUTPUT_FORMAT=worker-vllm
    on the endpoint (docs/deploy.md, Switching from worker-vllm), and then reads the same text."""
    job = {"prompt": "Hello", "sampling_params": {"max_tokens": 6, "ignore_eos": True, "temperature": 0}}
    ours = run(loop, make_worker(), job)
    with pytest.raises(KeyError):
        worker_vllm_client(ours["output"])
    theirs = run(loop, make_worker(OUTPUT_FORMAT="worker-vllm"), job)
    assert theirs["status"] == "COMPLETED" and worker_vllm_client(theirs["output"]) == text_of(ours)
    # worker-vllm 2.24+ (its vllm serve proxy) answers such a job with vLLM's OpenAI response;
    # here the job asks for it with use_openai_format
    openai = run(loop, make_worker(), {**job, "use_openai_format": True})
    assert openai["output"][0]["choices"][0]["text"] == text_of(ours)
