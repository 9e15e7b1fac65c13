"""ENABLE_LORA, LORA_MODULES, MAX_LORAS, MAX_LORA_RANK, MAX_CPU_LORAS: LORA_MODULES in worker-vllm's
JSON form and vLLM's `name=path` form (VLLM_EXTRA_ARGS' --lora-modules too), stable lora_int_ids,
coded refusals naming the variable, and the engine config they make."""
import dataclasses

import pytest

from handler.engine_setup import check_engine_settings, engine_config
from handler.lora.modules import LoRAModule, lora_enabled
from handler.settings import SettingsError, load_settings

A, B = "/adapters/a", "/adapters/b"
TWO = (LoRAModule("a", A, 1), LoRAModule("b", B, 2))


@pytest.mark.parametrize("raw", [
    f'[{{"name": "a", "path": "{A}"}}, {{"name": "b", "path": "{B}"}}]',  # worker-vllm's JSON list
    f"a={A} b={B}", f"a={A},b={B}", f" a={A} ,\n b={B} ",  # vLLM's --lora-modules entries
])
def test_both_forms_give_the_adapters_in_order_with_stable_ids(raw):
    s = load_settings({"LORA_MODULES": raw})
    assert s.lora_modules == TWO and lora_enabled(s) and s.enable_lora is None
    check_engine_settings(s)
    config = engine_config(s, "/some/model")
    assert (config.enable_lora, config.max_loras, config.max_lora_rank, config.max_cpu_loras) == (True, 1, 16, None)


def test_one_object_and_base_model_name():
    """worker-vllm's first form, one object; base_model_name kept (the /v1/models parent)."""
    s = load_settings({"LORA_MODULES": '{"name": "sql", "path": "org/sql-lora", "base_model_name": "org/base"}'})
    assert s.lora_modules == (LoRAModule("sql", "org/sql-lora", 1, "org/base"),)


def test_the_knobs_reach_the_engine():
    s = load_settings({"ENABLE_LORA": "true", "MAX_LORAS": "4", "MAX_LORA_RANK": "64", "MAX_CPU_LORAS": "8"})
    config = engine_config(s, "/some/model")
    assert (config.enable_lora, config.max_loras, config.max_lora_rank, config.max_cpu_loras) == (True, 4, 64, 8)
    assert not engine_config(load_settings({}), "/m").enable_lora
    assert not lora_enabled(load_settings({"LORA_MODULES": "[]"}))  # an empty list names none
    assert lora_enabled(load_settings({"ENABLE_LORA": "1"}))  # on with no adapter: jobs run the base model


@pytest.mark.parametrize("raw, reason", [
    ('[{"name": "a", "path": "/x"', "bad_json"),
    ('[{"name": "a"}]', "missing_path"),
    ('[{"path": "/x"}]', "missing_name"),
    ("a=", "missing_path"),
    ("=/x", "missing_name"),
    ("a=/x a=/y", "duplicate_name"),
    ('[{"name": "a", "path": "/x"}, {"name": "a", "path": "/y"}]', "duplicate_name"),
    ("/just/a/path", "bad_entry"),
    ("[1]", "bad_entry"),
    ('"a=/x"', "bad_entry"),
    ('[{"name": "a", "path": "/x", "rank": 8}]', "unknown_key"),
    ('[{"name": "a\\u001b[31m", "path": "/x"}]', "bad_name"),
    ('[{"name": 7, "path": "/x"}]', "bad_name"),
    ('[{"name": "a", "path": ["/x"]}]', "bad_path"),
])
def test_bad_entries_are_coded_refusals_naming_lora_modules(raw, reason):
    with pytest.raises(SettingsError) as info:
        load_settings({"LORA_MODULES": raw})
    assert info.value.name == "LORA_MODULES" and info.value.reason == reason, (str(info.value), info.value.reason)
    assert str(info.value).startswith(f"LORA_MODULES={raw!r}: ")


def test_what_settings_together_refuse():
    with pytest.raises(SettingsError) as info:  # an explicit false beside adapters: which one was meant?
        check_engine_settings(load_settings({"ENABLE_LORA": "false", "LORA_MODULES": f"a={A}"}))
    assert info.value.name == "ENABLE_LORA" and info.value.reason == "conflict" and "LORA_MODULES" in str(info.value)
    with pytest.raises(SettingsError) as info:  # a job's `model` could not tell them apart
        check_engine_settings(load_settings({"MODEL_NAME": "org/base", "LORA_MODULES": "org/base=/x"}))
    assert info.value.name == "LORA_MODULES" and info.value.reason == "duplicate_name"
    with pytest.raises(SettingsError) as info:  # no tensor parallelism with LoRA: named as the user set it
        check_engine_settings(load_settings({"LORA_MODULES": f"a={A}", "TENSOR_PARALLEL_SIZE": "2"}))
    assert info.value.name == "LORA_MODULES" and "TENSOR_PARALLEL_SIZE=1" in str(info.value)
    with pytest.raises(SettingsError, match="^ENABLE_LORA='true': .*tensor parallelism"):
        check_engine_settings(load_settings({"ENABLE_LORA": "true", "TENSOR_PARALLEL_SIZE": "2"}))
    with pytest.raises(SettingsError, match="^MAX_CPU_LORAS='2': .*at least max_loras"):
        check_engine_settings(load_settings({"MAX_LORAS": "4", "MAX_CPU_LORAS": "2"}))
    for name, value in (("MAX_LORAS", "0"), ("MAX_LORA_RANK", "1024"), ("ENABLE_LORA", "maybe")):
        with pytest.raises(SettingsError, match=f"^{name}="):
            load_settings({name: value})
    check_engine_settings(dataclasses.replace(load_settings({}), enable_lora=True))


def test_vllm_extra_args_lora_flags():
    """`--lora-modules` takes several words, as vLLM's nargs='+'."""
    s = load_settings({"VLLM_EXTRA_ARGS": f"--enable-lora --lora-modules a={A} b={B} --max-loras 2 "
                                          "--max-lora-rank 32 --max-cpu-loras 4"})
    assert s.lora_modules == TWO and s.enable_lora is True
    assert (s.max_loras, s.max_lora_rank, s.max_cpu_loras) == (2, 32, 4)
    with pytest.raises(SettingsError) as info:
        load_settings({"VLLM_EXTRA_ARGS": f"--lora-modules a={A} a={B}"})
    assert info.value.name == "LORA_MODULES" and info.value.reason == "duplicate_name"


def test_the_worker_vllm_table_honours_the_lora_variables():
    from handler.settings import SETTINGS_BY_NAME
    from handler.worker_vllm_env import start_notes
    from handler.worker_vllm_names import HONOURED, NOTED, REFUSED, RULES, markdown

    table = markdown()
    env = {"ENABLE_LORA": "true", "LORA_MODULES": f"a={A}", "MAX_LORAS": "2", "MAX_LORA_RANK": "8",
           "MAX_CPU_LORAS": "2"}
    for name in env:
        assert RULES[name].kind == HONOURED and name in SETTINGS_BY_NAME
        assert f"| `{name}` | honoured |" in table
    assert start_notes(env, SETTINGS_BY_NAME) == []  # nothing logged as not applicable
    assert RULES["DEFAULT_MM_LORAS"].kind == REFUSED  # per-modality adapters: text-only models here
    assert all(RULES[n].kind == NOTED for n in ("LORA_DTYPE", "FULLY_SHARDED_LORAS", "LONG_LORA_SCALING_FACTORS"))
