"""Adapters in the engine on CUDA: requests of three adapters and of the base model share steps
replayed from CUDA graphs (decode and mixed), two slots for three adapters (a slot rewritten
between replays); each request's tokens are its merged model's greedy choices (transformers,
float32, teacher-forced), logprobs within 2e-3. Steps with an adapter's rows replay the graphs
with the LoRA kernels, steps of base model requests only the graphs without. The memory
profile that sizes the KV cache leaves out what the tuner allocates."""
import gc
import random

import torch

from benchmarks.lora_serve import write_adapter
from engine import LLM, LoRARequest, SamplingParams
from tests import lora_adapters, models

SHAPES = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=2)


def _hf_logprobs(path, prompt, gen):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").cuda().eval()
    with torch.no_grad():
        ids = torch.tensor([prompt + gen], device="cuda")
        return model(ids).logits[0].float().log_softmax(-1)[len(prompt) - 1 : -1]


def test_adapters_in_cuda_graphs_match_their_merged_models(tmp_path):
    base = models.make_checkpoint(str(tmp_path / "base"), "llama", seed=3, **SHAPES)
    adapters = [write_adapter(str(tmp_path / f"a{i}"), SHAPES, rank=(4, 8, 8)[i], seed=i, b_scale=0.05)
                for i in range(3)]
    merged = [lora_adapters.merge_into(base, a, str(tmp_path / f"m{i}")) for i, a in enumerate(adapters)]
    loras = [LoRARequest(f"a{i}", i + 1, a) for i, a in enumerate(adapters)] + [None]
    llm = LLM(base, device="cuda", dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8, max_num_seqs=8,
              num_kv_blocks=512, max_num_batched_tokens=256)
    runner = llm.engine.runner
    assert runner.graphs is not None and runner.mixed is not None
    replayed = []  # (decode or mixed, with adapters) a replay
    for kind, graphs in (("decode", runner.graphs), ("mixed", runner.mixed)):
        def recorded(size, adapters=False, _replay=graphs.replay, _kind=kind):
            replayed.append((_kind, adapters))
            return _replay(size, adapters)
        graphs.replay = recorded
    rng = random.Random(0)
    prompts = [[rng.randrange(5, 400) for _ in range(n)] for n in (1, 9, 17, 50, 130, 3, 40, 77)]
    which = [loras[i % 4] for i in range(len(prompts))]
    # the base model's last request outlives the others: its decode steps run alone
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [SamplingParams(max_tokens=40 if i == 7 else 16, temperature=0, ignore_eos=True, logprobs=0)
                         for i in range(len(prompts))], lora_request=which)
    assert runner.mixed.replays > 0
    assert {("decode", True), ("decode", False), ("mixed", True)} <= set(replayed), set(replayed)
    for prompt, lora, out in zip(prompts, which, outs):
        gen = out.outputs[0].token_ids
        ref = _hf_logprobs(merged[lora.lora_int_id - 1] if lora else base, prompt, gen)
        assert ref.argmax(-1).tolist() == gen, (lora and lora.lora_name, len(prompt))
        ours = torch.tensor([d[t].logprob for d, t in zip(out.outputs[0].logprobs, gen)], device="cuda")
        err = float((ours - ref[torch.arange(len(gen), device="cuda"), gen]).abs().max())
        assert err < 2e-3, (lora and lora.lora_name, err)
    stats = llm.engine.stats()
    assert stats["lora_evictions"] >= 1 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_the_memory_profile_leaves_out_what_tuning_allocates(tmp_path, monkeypatch):
    """The KV cache is sized from a profiled full-budget step. The first engine of a process with
    an empty tuner cache tunes that step's kernels (the LoRA expand's timing output at 8,192
    tokens alone is the size of gate/up's output); its profiled peak is the second engine's,
    which tunes nothing."""
    monkeypatch.setenv("LLM_KERNELS_CACHE_DIR", str(tmp_path / "tuner"))
    shapes = dict(hidden_size=640, intermediate_size=2560, num_hidden_layers=2, num_attention_heads=10,
                  num_key_value_heads=2)  # sizes no other test tunes in this process
    base = models.make_checkpoint(str(tmp_path / "base"), "llama", seed=5, **shapes)
    peaks = []
    for _ in range(2):
        llm = LLM(base, device="cuda", dtype="bfloat16", enable_lora=True, max_loras=2, max_lora_rank=16,
                  max_num_seqs=8, max_num_batched_tokens=8192, gpu_memory_utilization=0.5)
        peaks.append(llm.engine.memory["activation_peak_bytes"])
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    assert abs(peaks[0] - peaks[1]) <= 0.02 * peaks[1], peaks
