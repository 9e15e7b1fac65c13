"""Settings: one table, parsed from env vars; a bad value names its variable."""
import pytest

from handler.settings import SETTINGS, SettingsError, apply_base_path, describe, load_settings, settings_markdown


def test_defaults_come_from_the_table():
    s = load_settings({})
    for setting in SETTINGS:
        assert getattr(s, setting.attr) == setting.default
    assert s.max_concurrency == 30 and s.default_max_tokens == 4096 and s.enable_prefix_caching is True


def test_values_are_parsed_by_type():
    s = load_settings({"MAX_MODEL_LEN": " 4096 ", "GPU_MEMORY_UTILIZATION": "0.8", "ENABLE_PREFIX_CACHING": "false",
                       "QUANTIZATION": "AWQ", "BLOCK_SIZE": "32", "FAULT_INJECTION": '{"oom_at_step": 2}',
                       "MODEL_NAME": "org/model", "RAW_OPENAI_OUTPUT": "0"})
    assert s.max_model_len == 4096 and s.gpu_memory_utilization == 0.8
    assert s.enable_prefix_caching is False and s.raw_openai_output is False
    assert s.quantization == "awq" and s.block_size == 32
    assert s.fault_injection == {"oom_at_step": 2} and s.model_name == "org/model"


def test_empty_values_count_as_unset():
    s = load_settings({"MAX_MODEL_LEN": "", "MODEL_NAME": "  "})
    assert s.max_model_len is None and s.model_name is None


@pytest.mark.parametrize("name,value", [
    ("MAX_MODEL_LEN", "abc"), ("MAX_MODEL_LEN", "1.5"), ("MAX_MODEL_LEN", "1"),
    ("GPU_MEMORY_UTILIZATION", "0"), ("GPU_MEMORY_UTILIZATION", "1.5"), ("GPU_MEMORY_UTILIZATION", "nan"),
    ("ENABLE_PREFIX_CACHING", "maybe"), ("BLOCK_SIZE", "12"), ("DTYPE", "float8"), ("QUANTIZATION", "bogus"),
    ("MAX_CONCURRENCY", "0"), ("METRICS_PORT", "70000"), ("FAULT_INJECTION", "[1]"), ("FAULT_INJECTION", "{"),
    ("QUEUE_TIMEOUT_S", "-1"), ("LOG_LEVEL", "loud"),
])
def test_bad_value_names_the_variable(name, value):
    with pytest.raises(SettingsError) as info:
        load_settings({name: value})
    assert str(info.value).startswith(f"{name}={value!r}: ")
    assert info.value.name == name


def test_secrets_are_masked_in_the_startup_line():
    assert describe(load_settings({"HF_TOKEN": "hf_secret"}))["HF_TOKEN"] == "***"


def test_markdown_table_lists_every_variable():
    md = settings_markdown()
    assert md.startswith("| Variable | Type | Default | Description |")
    for setting in SETTINGS:
        assert f"| `{setting.name}` |" in md
    assert "`awq` \\| `awq_marlin` \\|" in md  # a choice setting lists its values


def test_engine_refusal_names_the_variable():
    import dataclasses

    from handler.engine_setup import check_engine_settings

    s = load_settings({})
    check_engine_settings(s)  # the defaults pass the engine's own checks
    with pytest.raises(SettingsError) as info:
        check_engine_settings(dataclasses.replace(s, block_size=12))  # past the table, the engine refuses
    assert str(info.value).startswith("BLOCK_SIZE=")


@pytest.mark.parametrize("template", [
    "{% for m in messages %}{{ m.content }",  # does not compile
    "{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}",  # an unknown filter
    "{{ raise_exception('Conversation roles must alternate') }}",  # refuses every conversation
    "{% for m in messages %}{{ m['role'].upper()[99] }}{% endfor %}",  # fails while rendering
    "{{ bos_token }}<|user|>",  # leaves the messages out
])
def test_a_broken_custom_chat_template_refuses_the_start_naming_it(template):
    from handler.engine_setup import check_engine_settings

    with pytest.raises(SettingsError) as info:
        check_engine_settings(load_settings({"CUSTOM_CHAT_TEMPLATE": template}))
    assert info.value.name == "CUSTOM_CHAT_TEMPLATE" and str(info.value).startswith("CUSTOM_CHAT_TEMPLATE=")
    check_engine_settings(load_settings({"CUSTOM_CHAT_TEMPLATE": "{% for m in messages %}<|{{ m.role }}|>"
                                                                 "{{ m.content }}{% endfor %}<|assistant|>"}))


def test_async_scheduling_reaches_the_engine_config():
    from handler.engine_setup import engine_config

    assert engine_config(load_settings({}), "m").async_scheduling is None  # the engine's own: on with CUDA
    assert engine_config(load_settings({"ASYNC_SCHEDULING": "1"}), "m").async_scheduling is True
    assert engine_config(load_settings({"ASYNC_SCHEDULING": "false"}), "m").async_scheduling is False


def test_base_path_holds_the_caches_whose_variables_are_unset(tmp_path):
    """HF_HOME, the kernels' tuned configs and Triton's compiled kernels go under BASE_PATH (a
    network volume), so the next worker on it skips the first one's tuning; set ones stay."""
    env = {"HF_HOME": "/mine"}
    apply_base_path(load_settings({"BASE_PATH": str(tmp_path)}), env)
    assert env == {"HF_HOME": "/mine", "LLM_KERNELS_CACHE_DIR": str(tmp_path / "llm-kernels-cache"),
                   "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}
    assert (tmp_path / "triton-cache").is_dir()
    env = {}
    apply_base_path(load_settings({}), env)
    assert env == {}  # no BASE_PATH: every cache where its library puts it


def test_triton_keeps_its_own_cache_when_base_path_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("")
    env = {}
    apply_base_path(load_settings({"BASE_PATH": str(tmp_path / "file")}), env)  # a file: nothing under it
    assert "TRITON_CACHE_DIR" not in env and env["HF_HOME"] == str(tmp_path / "file" / "huggingface-cache")
