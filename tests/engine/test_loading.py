"""Checkpoint loading: transformers 4 and 5 config styles, sharded
safetensors, and clear errors (before any weight is read) for what we do not run."""
import json
import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import ModelLoadError, UnsupportedModelError
from engine.model.loader import read_model_spec
from tests import models

PROMPT = {"prompt_token_ids": [5, 17, 33, 120, 64, 9, 250]}
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def _copy(src, dst, edit_config=None, drop_weights=False):
    models.copy_edited(src, dst, "config.json", edit_config)
    if drop_weights:
        for f in os.listdir(dst):
            if f.endswith(".safetensors"):
                os.remove(os.path.join(dst, f))
    return dst


def _tokens(path, **kw):
    return LLM(path, num_kv_blocks=64, **kw).generate([PROMPT], GREEDY)[0].outputs[0].token_ids


def test_transformers4_style_rope_config_gives_same_model(tiny_llama_dir, tmp_path):
    def to_v4(cfg):
        params = cfg.pop("rope_parameters")
        cfg["rope_theta"] = params.pop("rope_theta")
        cfg["rope_scaling"] = params
        cfg["transformers_version"] = "4.46.0"

    v4 = _copy(tiny_llama_dir, tmp_path / "v4", to_v4)
    spec4, spec5 = read_model_spec(str(v4)), read_model_spec(tiny_llama_dir)
    assert spec4.rope_theta == spec5.rope_theta and spec4.rope_scaling["rope_type"] == "llama3"
    assert spec4.rope_scaling["factor"] == spec5.rope_scaling["factor"] == 8.0
    assert _tokens(str(v4)) == _tokens(tiny_llama_dir)


def test_linear_rope_scaling_matches_transformers(tiny_llama_dir, tmp_path):
    path = models.make_checkpoint(str(tmp_path / "linear"), "llama", seed=9,
                                  rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})
    ours = LLM(path, num_kv_blocks=64).generate([PROMPT], SamplingParams(max_tokens=10, temperature=0))[0]
    assert ours.outputs[0].token_ids == models.hf_greedy(path, PROMPT["prompt_token_ids"], 10)


def test_sharded_checkpoint_with_index(tiny_llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    dst = _copy(tiny_llama_dir, tmp_path / "sharded", drop_weights=True)
    tensors = load_file(os.path.join(tiny_llama_dir, "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, os.path.join(dst, file))
        weight_map.update({k: file for k in keys})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(dst, "model.safetensors.index.json"), "w"))
    assert _tokens(str(dst)) == _tokens(tiny_llama_dir)


@pytest.mark.parametrize("edit,words", [
    (lambda c: c.update(architectures=["GPT2LMHeadModel"]), "architecture 'GPT2LMHeadModel'"),
    (lambda c: c["rope_parameters"].update(rope_type="dynamic"), "rope scaling 'dynamic'"),
    (lambda c: c.update(architectures=["Gemma3ForConditionalGeneration"]), "architecture 'Gemma3ForConditionalGeneration'"),
    (lambda c: c.update(quantization_config={"quant_method": "bitsandbytes"}), "quantization method 'bitsandbytes'"),
    (lambda c: c.update(quantization_config={"quant_method": "awq", "bits": 8, "group_size": 128}), "8 bits"),
    (lambda c: c.update(quantization_config={"quant_method": "awq", "bits": 4, "group_size": 96}), "group size 96"),
    (lambda c: c.update(quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128,
                                             "version": "gemv"}), "version 'gemv'"),
])
def test_unsupported_is_named_before_weights_are_read(tiny_llama_dir, tmp_path, edit, words):
    # weights removed: the error must come from the config, not from missing weights
    bad = _copy(tiny_llama_dir, tmp_path / "bad", edit, drop_weights=True)
    with pytest.raises(UnsupportedModelError) as err:
        LLM(str(bad), num_kv_blocks=8)
    assert words in str(err.value) and err.value.code == "model_load_failed"


def test_mistral_sliding_window_is_run_not_refused(tiny_mistral_dir, tmp_path):
    """A window shorter than the context now runs (it was refused before sliding-window
    attention); a window longer than every prompt changes nothing."""
    sw = _copy(tiny_mistral_dir, tmp_path / "sw", lambda c: c.update(sliding_window=64))
    assert read_model_spec(str(sw)).window(0) == 64
    LLM(str(sw), num_kv_blocks=8)
    ok = _copy(tiny_mistral_dir, tmp_path / "sw-ok", lambda c: c.update(sliding_window=4096))
    assert _tokens(str(ok), max_model_len=512) == _tokens(tiny_mistral_dir)


def test_pickle_checkpoints_are_refused(tiny_llama_dir, tmp_path):
    dst = _copy(tiny_llama_dir, tmp_path / "pickle", drop_weights=True)
    torch.save({"x": torch.zeros(1)}, os.path.join(dst, "pytorch_model.bin"))
    with pytest.raises(ModelLoadError, match="pickle"):
        LLM(str(dst), num_kv_blocks=8)


def test_missing_and_unexpected_tensors_fail_clearly(tiny_llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    dst = _copy(tiny_llama_dir, tmp_path / "missing", drop_weights=True)
    tensors = load_file(os.path.join(tiny_llama_dir, "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with pytest.raises(ModelLoadError, match="lacks"):
        LLM(str(dst), num_kv_blocks=8)
    tensors = load_file(os.path.join(tiny_llama_dir, "model.safetensors"))
    tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with pytest.raises(ModelLoadError, match="no place"):
        LLM(str(dst), num_kv_blocks=8)


def test_hub_id_offline_fails_with_model_load_failed(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelLoadError) as err:
        LLM("someone/not-cached-model", num_kv_blocks=8)
    assert "someone/not-cached-model" in str(err.value)


def test_dtype_auto_on_cpu_is_float32_without_native_bf16_and_bfloat16_with_it(tiny_qwen2_dir, monkeypatch):
    from engine import SamplingParams, llm_engine

    llm = LLM(tiny_qwen2_dir, num_kv_blocks=8)  # the suite runs as on a CPU without native bf16
    assert llm.engine.dtype == torch.float32 and llm.engine.device == "cpu"
    assert llm.engine.spec.tie_word_embeddings and llm.engine.spec.attention_bias
    monkeypatch.setattr(llm_engine, "cpu_has_native_bf16", lambda: True)
    llm = LLM(tiny_qwen2_dir, num_kv_blocks=8)
    assert llm.engine.dtype == torch.bfloat16
    assert next(llm.engine.runner.model.parameters()).dtype == torch.bfloat16
    (out,) = llm.generate(["Hello"], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 6


@pytest.mark.parametrize("field,value", [("block_size", 12), ("gpu_memory_utilization", 1.5), ("enforce_eager", "yes"),
                                         ("max_num_seqs", 0), ("load_format", "pt"), ("dtype", "int8")])
def test_engine_config_names_the_bad_field(field, value):
    from engine import EngineConfig
    from engine.errors import InvalidInputError

    with pytest.raises(InvalidInputError) as err:
        EngineConfig(model="m", **{field: value})
    assert err.value.field == field


def test_a_max_model_len_past_the_models_positions_is_refused_unless_allowed(tiny_mistral_dir, caplog):
    from engine.errors import InvalidInputError

    assert read_model_spec(tiny_mistral_dir).max_position_embeddings == 512
    with pytest.raises(InvalidInputError) as err:
        LLM(tiny_mistral_dir, num_kv_blocks=8, max_model_len=100_000)
    assert err.value.field == "max_model_len" and "100000" in str(err.value) and "512" in str(err.value)
    with caplog.at_level("WARNING"):
        llm = LLM(tiny_mistral_dir, num_kv_blocks=8, max_model_len=1024, allow_long_max_model_len=True)
    assert llm.engine.max_model_len == 1024 and "more than the model's 512 positions" in caplog.text


@pytest.mark.parametrize("field,value", [("max_position_embeddings", 10**12), ("num_hidden_layers", 0),
                                         ("vocab_size", 10**9)])
def test_a_config_size_out_of_range_is_named_before_weights_are_read(tiny_llama_dir, tmp_path, field, value):
    bad = _copy(tiny_llama_dir, tmp_path / "bad", lambda c: c.update({field: value}), drop_weights=True)
    with pytest.raises(ModelLoadError) as err:
        LLM(str(bad), num_kv_blocks=8)
    assert f"config.json: {field}=" in str(err.value) and err.value.code == "model_load_failed"
