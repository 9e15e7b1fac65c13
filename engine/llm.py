"""LLM: the offline front end (vLLM's `LLM`): generate and chat on a batch."""
from __future__ import annotations

import itertools

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, *, dtype: str = "auto", device: str = "auto", block_size: int = 16,
                 max_model_len: int | None = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: int | None = None, enable_prefix_caching: bool = True,
                 gpu_memory_utilization: float = 0.9, num_kv_blocks: int | None = None, seed: int = 0,
                 speculative_config: dict | None = None, **kwargs):
        config = EngineConfig(
            model=model, dtype=dtype, device=device, block_size=block_size, max_model_len=max_model_len,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching, gpu_memory_utilization=gpu_memory_utilization,
            num_kv_blocks=num_kv_blocks, seed=seed, speculative_config=speculative_config, **kwargs,
        )
        self.engine = LLMEngine(config)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 priority: list[int] | None = None, lora_request=None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. Prompts: strings or
        {"prompt_token_ids": [...]} dicts (a single one is accepted too). lora_request: an
        engine.LoRARequest for every prompt, or a list of one (or None) per prompt."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError("one LoRARequest per prompt, or one for all")
        ids = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, plist)):
                rid = f"llm-{next(self._ids)}"
                self.engine.add_request(rid, prompt, p, priority=priority[i] if priority else 0, lora_request=loras[i])
                ids.append(rid)
        except Exception:
            for rid in ids:  # the prompts queued before the one refused are not left behind
                self.engine.abort_request(rid)
            raise
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    if out.error is not None:
                        for rid in ids:
                            self.engine.abort_request(rid)
                        raise out.error
                    done[out.request_id] = out
        return [done[rid] for rid in ids]

    def chat(self, conversations, params: SamplingParams | None = None, add_generation_prompt: bool = True,
             lora_request=None):
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        prompts = [{"messages": conv, "add_generation_prompt": add_generation_prompt} for conv in conversations]
        return self.generate(prompts, params, lora_request=lora_request)

    def stats(self) -> dict:
        return self.engine.stats()
