"""quantization= (vLLM's names) checked against the checkpoint, and unsupported
GPTQ / compressed-tensors / FP8 variants refused from config.json alone, naming
the field, before any weight is read."""
import json
import shutil

import pytest

from engine import LLM, EngineConfig
from engine.errors import InvalidInputError, UnsupportedModelError
from engine.model.loader import read_model_spec

W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}
FP8_W = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}
FP8_A = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}


def ct(weights=W4, act=None, fmt="pack-quantized", **extra):
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act}},
            **extra}


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def _no_weights(src, dst, qc):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = json.load(open(dst / "config.json"))
    if qc is None:
        cfg.pop("quantization_config", None)
    else:
        cfg["quantization_config"] = qc
    json.dump(cfg, open(dst / "config.json", "w"))
    return str(dst)


@pytest.mark.parametrize("qc,words", [
    ({**GPTQ, "bits": 3}, "GPTQ with 3 bits"),
    ({**GPTQ, "bits": 2}, "GPTQ with 2 bits"),
    ({**GPTQ, "group_size": 96}, "GPTQ group size 96"),
    ({**GPTQ, "checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
    ({**GPTQ, "lm_head": True}, "quantized lm_head"),
    (ct({**W4, "num_bits": 2}), "weights of 2 bits"),
    (ct({**W4, "num_bits": 3}), "weights of 3 bits"),
    (ct(sparsity_config={"format": "sparse-24-bitmask"}), "sparsity (sparsity_config)"),
    (ct(W4, {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}), "input_activations int8"),
    (ct(FP8_W, {**FP8_A, "dynamic": False, "strategy": "tensor"}, "float-quantized"), "input_activations float8 tensor"),
    (ct(FP8_W, FP8_A, "float-quantized", ignore=[]), "quantized lm_head"),
    (ct({**FP8_W, "strategy": "block", "block_structure": [128, 128]}, None, "float-quantized"), "strategy 'block'"),
    (ct(fmt="marlin-24"), "format 'marlin-24'"),
    (ct({**W4, "strategy": "tensor"}), "weight strategy 'tensor'"),
    ({**ct(), "config_groups": {"g": {"targets": ["re:.*q_proj"], "weights": W4}}}, "targets ['re:.*q_proj']"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "activation_scheme 'static'"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "FP8 format 'e5m2'"),
])
def test_unsupported_variant_named_before_weights(tiny_llama_dir, tmp_path, qc, words):
    bad = _no_weights(tiny_llama_dir, tmp_path / "bad", qc)
    with pytest.raises(UnsupportedModelError) as err:
        LLM(bad, num_kv_blocks=8)
    assert words in str(err.value) and err.value.code == "model_load_failed"


@pytest.mark.parametrize("asked,qc,ok", [
    ("gptq", GPTQ, True), ("gptq_marlin", GPTQ, True), ("awq", GPTQ, False),
    ("compressed-tensors", ct(), True), ("gptq", ct(), False), ("fp8", ct(FP8_W, FP8_A, "float-quantized"), False),
    ("fp8", {"quant_method": "fp8", "weight_block_size": [128, 128]}, True),
    ("awq_marlin", {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True}, True),
    ("none", GPTQ, False), ("None", None, True), ("fp8", None, False), ("gptq", None, False),
])
def test_quantization_name_checked_against_checkpoint(tiny_llama_dir, tmp_path, asked, qc, ok):
    path = _no_weights(tiny_llama_dir, tmp_path / "m", qc)
    if ok:
        read_model_spec(path, asked)
        return
    with pytest.raises(UnsupportedModelError, match=f"QUANTIZATION={asked} "):
        read_model_spec(path, asked)


def test_unknown_quantization_name_is_invalid_input():
    with pytest.raises(InvalidInputError) as err:
        EngineConfig(model="m", quantization="bitsandbytes")
    assert err.value.field == "quantization" and "gptq_marlin" in str(err.value)


def test_ct_ignore_matches_names_exactly_and_by_regex(tiny_llama_dir, tmp_path):
    """`ignore` entries are whole names or re: regexes, never substrings; a merged linear
    whose projections are only partly ignored is refused."""
    spec = read_model_spec(_no_weights(tiny_llama_dir, tmp_path / "a", ct(
        ignore=["lm_head", "model.layers.0.mlp.down_proj", "re:.*layers\\.1\\.self_attn\\.(q|k|v)_proj$"])))
    q = spec.quant
    assert not q.covers("model.layers.0.mlp.down_proj") and q.covers("model.layers.10.mlp.down_proj")
    assert q.covers("model.layers.0.self_attn.qkv_proj") and not q.covers("model.layers.1.self_attn.qkv_proj")
    partial = read_model_spec(_no_weights(tiny_llama_dir, tmp_path / "b", ct(
        ignore=["lm_head", "model.layers.0.mlp.gate_proj"]))).quant
    with pytest.raises(UnsupportedModelError, match="only some are quantized"):
        partial.covers("model.layers.0.mlp.gate_up_proj")


def test_gptq_act_order_refused_for_row_parallel(tiny_llama_dir, tmp_path):
    spec = read_model_spec(_no_weights(tiny_llama_dir, tmp_path / "g", {**GPTQ, "desc_act": True}))
    assert spec.quant.tp_unit("column")[0] == 8
    with pytest.raises(UnsupportedModelError, match="desc_act"):
        spec.quant.tp_unit("row")
