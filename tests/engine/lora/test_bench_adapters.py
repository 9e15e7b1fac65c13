"""benchmarks/lora_serve.py's random adapters are adapters the engine takes, of the bytes its floor counts."""
import os

from benchmarks import lora_serve
from engine import LLM, LoRARequest, SamplingParams

TINY_QWEN2 = dict(arch="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)


def test_benchmark_adapters_load_and_run(tiny_qwen2_dir, tmp_path):
    path = lora_serve.write_adapter(str(tmp_path / "a"), TINY_QWEN2, rank=4, seed=0)
    weights = os.path.getsize(os.path.join(path, "adapter_model.safetensors"))
    assert 0 < weights - lora_serve.adapter_bytes(TINY_QWEN2, 4) < 16384  # the tensors plus the header
    llm = LLM(tiny_qwen2_dir, enable_lora=True, max_lora_rank=4, num_kv_blocks=64)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(5, 30))}
    plain = llm.generate([prompt], params)[0].outputs[0].token_ids
    adapted = llm.generate([prompt], params, lora_request=LoRARequest("bench", 1, path))[0]
    assert len(adapted.outputs[0].token_ids) == 8
    assert len(llm.engine.lora.cpu[1].pairs) == 2 * 7  # 7 projections a layer, on q/k/v and gate/up shards
    assert plain  # the base request ran beside


def test_merged_reference_of_the_gpu_test_matches_the_engine(tiny_llama_dir, tmp_path):
    """tests/gpu/test_lora_engine_gpu.py's reference (the adapter merged into the weights, no peft)
    agrees with the engine on the CPU, and with peft's own merge."""
    from tests import lora_adapters, models

    shapes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
    path = lora_serve.write_adapter(str(tmp_path / "a"), shapes, rank=4, seed=1, b_scale=0.3)
    merged = lora_adapters.merge_into(tiny_llama_dir, path, str(tmp_path / "merged"))
    llm = LLM(tiny_llama_dir, enable_lora=True, max_lora_rank=4, num_kv_blocks=64)
    prompt = list(range(5, 30))
    got = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=8, temperature=0),
                       lora_request=LoRARequest("bench", 1, path))[0].outputs[0].token_ids
    assert got == models.hf_greedy(merged, prompt, 8) == lora_adapters.peft_greedy(tiny_llama_dir, path, prompt, 8)
    assert got != models.hf_greedy(tiny_llama_dir, prompt, 8)
