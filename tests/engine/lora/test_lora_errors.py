"""Bad adapters fail the requests that name them with a coded error (invalid_input, a reason,
the adapter's name) before anything is queued; the engine and other requests go on."""
import asyncio
import os

import pytest
from safetensors.torch import load_file, save_file

from engine import LLM, AsyncLLMEngine, EngineConfig, LoRARequest, SamplingParams
from engine.errors import InvalidInputError, LoRAError
from tests import lora_adapters, models


def _copy(src, dst, edit_config=None, edit_tensors=None):
    models.copy_edited(src, dst, "adapter_config.json", edit_config)
    if edit_tensors:
        path = os.path.join(dst, "adapter_model.safetensors")
        save_file(edit_tensors(load_file(path)), path)
    return str(dst)


def _rename_layer(tensors):
    return {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}


def _nan(tensors):
    key = next(k for k in tensors if "lora_B" in k)
    tensors[key][0, 0] = float("nan")
    return tensors


def _cases(adapters, tmp_path, other_base_adapter):
    src = adapters["attn"]  # rank 4: within the cap of the test below
    missing_weights = _copy(src, tmp_path / "no-weights")
    os.remove(os.path.join(missing_weights, "adapter_model.safetensors"))
    bad_json = _copy(src, tmp_path / "bad-json")
    open(os.path.join(bad_json, "adapter_config.json"), "w").write("{not json")
    return {
        "missing_file": str(tmp_path / "nowhere"),
        "missing_weights": missing_weights,
        "bad_config": bad_json,
        "rank_too_large": adapters["all"],  # rank 8 against max_lora_rank 4 below
        "unknown_module": _copy(src, tmp_path / "layer7", edit_tensors=_rename_layer),
        "non_finite": _copy(src, tmp_path / "nan", edit_tensors=_nan),
        "shape": other_base_adapter,
        "unsupported": _copy(src, tmp_path / "dora", edit_config=lambda c: c.update(use_dora=True)),
        "unsupported_modules_to_save": _copy(src, tmp_path / "save", edit_config=lambda c: c.update(
            modules_to_save=["lm_head"])),
    }


@pytest.fixture(scope="module")
def other_base_adapter(ckpt_dir, tmp_path_factory):
    """An adapter of another base (hidden 128): its pairs do not fit the tiny Llama's linears."""
    other = models.make_checkpoint(str(ckpt_dir / "llama128"), "llama", seed=5, hidden_size=128,
                                   intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    return lora_adapters.make_adapter(other, str(tmp_path_factory.mktemp("other") / "a"), seed=3, r=4)


def test_each_bad_adapter_fails_with_its_reason_and_nothing_else_does(tiny_llama_dir, adapters, tmp_path,
                                                                     other_base_adapter):
    llm = LLM(tiny_llama_dir, enable_lora=True, max_lora_rank=4, max_loras=2, num_kv_blocks=128)
    good = LoRARequest("mlp-half", 1, lora_adapters.make_adapter(tiny_llama_dir, str(tmp_path / "good"), seed=5, r=4,
                                                                 targets=lora_adapters.MLP))
    params = SamplingParams(max_tokens=5, temperature=0)
    before = llm.generate(["Meeting notes"], params, lora_request=good)[0].outputs[0].token_ids
    for i, (case, path) in enumerate(_cases(adapters, tmp_path, other_base_adapter).items()):
        with pytest.raises(LoRAError) as err:
            llm.generate(["Meeting notes", "The quick"], params,
                         lora_request=[good, LoRARequest(f"bad-{case}", 10 + i, path)])
        info = err.value.to_dict()
        reason = case.removeprefix("unsupported_").replace("missing_weights", "missing_file")
        reason = "unsupported" if case.startswith("unsupported") else reason
        assert info["code"] == "invalid_input" and info["reason"] == reason, (case, info)
        assert info["adapter"] == f"bad-{case}" and info["field"] == "lora_request"
        assert f"bad-{case}" in info["message"]
        assert not llm.engine.has_unfinished_requests()  # the good request queued first was taken back
    assert llm.generate(["Meeting notes"], params, lora_request=good)[0].outputs[0].token_ids == before
    stats = llm.engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and llm.engine.lora.users == {}


def test_one_id_names_one_adapter(tiny_llama_dir, adapters):
    llm = LLM(tiny_llama_dir, enable_lora=True, max_lora_rank=8, num_kv_blocks=64)
    llm.generate(["a"], SamplingParams(max_tokens=2), lora_request=LoRARequest("all", 1, adapters["all"]))
    with pytest.raises(LoRAError, match="one id names one adapter") as err:
        llm.generate(["a"], SamplingParams(max_tokens=2), lora_request=LoRARequest("mlp", 1, adapters["mlp"]))
    assert err.value.reason == "id_conflict"


def test_adapters_need_enable_lora(tiny_llama_dir, adapters):
    llm = LLM(tiny_llama_dir, num_kv_blocks=64)
    with pytest.raises(InvalidInputError, match="enable_lora") as err:
        llm.generate(["a"], SamplingParams(max_tokens=2), lora_request=LoRARequest("all", 1, adapters["all"]))
    assert err.value.field == "lora_request"


@pytest.mark.parametrize("kwargs, field", [
    ({"max_loras": 0}, "max_loras"), ({"max_lora_rank": 1000}, "max_lora_rank"),
    ({"max_lora_rank": "16"}, "max_lora_rank"), ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras"),
    ({"enable_lora": "yes"}, "enable_lora"), ({"enable_lora": True, "tensor_parallel_size": 2}, "enable_lora"),
])
def test_lora_settings_are_checked(kwargs, field):
    with pytest.raises(InvalidInputError) as err:
        EngineConfig(model="m", **kwargs)
    assert err.value.field == field


@pytest.mark.parametrize("kwargs, field", [
    ({"lora_name": ""}, "lora_request.lora_name"), ({"lora_int_id": 0}, "lora_request.lora_int_id"),
    ({"lora_int_id": True}, "lora_request.lora_int_id"), ({"lora_path": ""}, "lora_request.lora_path"),
])
def test_lora_request_fields_are_checked(kwargs, field):
    with pytest.raises(InvalidInputError) as err:
        LoRARequest(**{"lora_name": "a", "lora_int_id": 1, "lora_path": "/x", **kwargs})
    assert err.value.field == field


def test_async_engine_fails_only_the_bad_adapters_request(tiny_llama_dir, adapters, tmp_path):
    engine = AsyncLLMEngine.from_config(EngineConfig(model=tiny_llama_dir, enable_lora=True, max_lora_rank=8,
                                                     num_kv_blocks=64))
    good = LoRARequest("all", 1, adapters["all"])
    nan = _copy(adapters["all"], tmp_path / "nan", edit_tensors=_nan)

    async def run(rid, lora):
        try:
            async for out in engine.generate("Meeting notes", SamplingParams(max_tokens=6, temperature=0),
                                             request_id=rid, lora_request=lora):
                last = out
            return last.outputs[0].token_ids
        except LoRAError as exc:
            return exc.reason

    async def main():
        try:
            return await asyncio.gather(run("good", good), run("bad", LoRARequest("nan", 2, nan)), run("base", None))
        finally:
            await engine.shutdown()

    good_tokens, bad, base = asyncio.run(main())
    assert bad == "non_finite"
    ids = engine.engine.tokenizer.encode("Meeting notes")
    assert good_tokens == lora_adapters.peft_greedy(tiny_llama_dir, adapters["all"], ids, 6)
    assert isinstance(base, list) and base != good_tokens  # the base request ran, without the adapter
