"""Request features keep their meaning under an adapter: logprobs are the adapted model's,
speculative decoding leaves greedy output unchanged, structured output masks the adapted
logits, n > 1 choices share the adapter's slot."""
import re

import torch

from engine import LLM, LoRARequest, SamplingParams
from tests import lora_adapters
from tests.engine.spec_decode.oracle import use_oracle

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "disable_by_batch_size": 64}
PROMPTS = [list(range(5, 45)), [9, 8, 7, 6, 5, 9, 8, 7], [300, 200, 100] * 5]


def test_logprobs_are_the_adapted_models(tiny_llama_dir, adapters):
    llm = LLM(tiny_llama_dir, enable_lora=True, max_lora_rank=8, num_kv_blocks=128)
    prompt = PROMPTS[0]
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=6, temperature=0, logprobs=2),
                       lora_request=LoRARequest("all", 1, adapters["all"]))[0].outputs[0]
    model = lora_adapters._peft_model(tiny_llama_dir, adapters["all"], merged=False)
    with torch.no_grad():  # teacher-forced: PEFT scores our continuation
        ref = model(input_ids=torch.tensor([prompt + out.token_ids])).logits[0].log_softmax(-1)
    ref = ref[len(prompt) - 1 : -1]
    ours = torch.tensor([lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)])
    torch.testing.assert_close(ours, ref[torch.arange(len(out.token_ids)), out.token_ids], rtol=0, atol=1e-4)


def test_speculation_leaves_adapted_greedy_output_unchanged(tiny_llama_dir, adapters, monkeypatch):
    loras = [LoRARequest("all", 1, adapters["all"]), LoRARequest("attn", 2, adapters["attn"]), None]
    params = SamplingParams(max_tokens=16, temperature=0)
    kwargs = dict(enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=256, max_model_len=512)
    plain = LLM(tiny_llama_dir, **kwargs)
    want = [o.outputs[0].token_ids for o in plain.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                                            lora_request=loras)]
    use_oracle(monkeypatch, {tuple(p): w for p, w in zip(PROMPTS, want)}, 400)
    spec = LLM(tiny_llama_dir, speculative_config=NGRAM, **kwargs)
    got = [o.outputs[0].token_ids for o in spec.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                                          lora_request=loras)]
    assert got == want
    stats = spec.engine.stats()
    assert stats["spec_accepted_tokens"] > 0, stats  # verify steps ran with the adapters' slots
    assert spec.engine.lora.refs == [0, 0]
    # a draft model (the base model drafting for its adapted self) changes nothing either
    monkeypatch.undo()
    drafted = LLM(tiny_llama_dir, speculative_config={"method": "draft_model", "model": tiny_llama_dir,
                                                      "num_speculative_tokens": 4, "disable_by_batch_size": 64}, **kwargs)
    got = [o.outputs[0].token_ids for o in drafted.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                                             lora_request=loras)]
    assert got == want and drafted.engine.stats()["spec_draft_tokens"] > 0


def test_structured_output_and_n_choices_under_an_adapter(tiny_llama_dir, adapters):
    llm = LLM(tiny_llama_dir, enable_lora=True, max_lora_rank=8, num_kv_blocks=256)
    lora = LoRARequest("mlp", 3, adapters["mlp"])
    pattern = r"[a-c]{3}-[0-9]{2}"
    outs = llm.generate(["Meeting notes"] * 2, SamplingParams(max_tokens=20, temperature=1.0, n=3, seed=None,
                                                              structured_outputs={"regex": pattern}), lora_request=lora)
    texts = [c.text for o in outs for c in o.outputs]
    assert len(texts) == 6 and all(re.fullmatch(pattern, t) for t in texts), texts
    assert llm.engine.lora.refs == [0] and llm.engine.lora.users == {}
