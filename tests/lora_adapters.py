"""PEFT LoRA adapters for the tiny checkpoints (made by peft itself, B random so they change
the output) and PEFT's own greedy generate with them: the references of the LoRA tests."""
from __future__ import annotations

import torch

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def make_adapter(base: str, path: str, seed: int, r: int = 8, alpha: float = 16, targets=None,
                 use_rslora: bool = False, scale: float = 0.3, **config) -> str:
    """A LoRA adapter of `base` saved in PEFT's format at `path`, its A and B random (seeded)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or ATTN + MLP, use_rslora=use_rslora,
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **config)
    peft_model = get_peft_model(model, lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    peft_model.save_pretrained(path)
    return path


_CACHE: dict = {}


def _peft_model(base: str, adapter: str, merged: bool):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    key = (base, adapter, merged)
    if key not in _CACHE:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = PeftModel.from_pretrained(model, adapter)
        _CACHE[key] = (model.merge_and_unload() if merged else model).eval()
    return _CACHE[key]


def peft_greedy(base: str, adapter: str, prompt_ids: list[int], max_new_tokens: int, merged: bool = False):
    """PEFT's greedy generate with the adapter (merged into the weights, or beside them), float32."""
    model = _peft_model(base, adapter, merged)
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def merge_into(base: str, adapter: str, dst: str) -> str:
    """A dense checkpoint of `base` with the adapter merged into its weights (W + scaling B A, in
    float32): the reference where peft is not installed (the GPU machine). The CPU tests check our
    engine against peft's own merge; this is the same sum."""
    import json
    import math
    import os
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(base, dst, dirs_exist_ok=True)
    config = json.load(open(os.path.join(adapter, "adapter_config.json")))
    pairs = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    weights = load_file(os.path.join(dst, "model.safetensors"))
    for key, a in pairs.items():
        if ".lora_A." not in key:
            continue
        b = pairs[key.replace(".lora_A.", ".lora_B.")]
        r = a.shape[0]
        scaling = config["lora_alpha"] / (math.sqrt(r) if config.get("use_rslora") else r)
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        w = weights[name]
        weights[name] = (w.float() + scaling * b.float() @ a.float()).to(w.dtype)
    save_file(weights, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst
