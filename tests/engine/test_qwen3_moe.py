"""Qwen3-MoE: the router and experts against transformers' own block, greedy parity
with transformers float32 on the CPU (many prompts together, block sizes, prefix
caching, chunked prefill), both checkpoint spellings of the experts, the loader's
errors, the Triton path under the interpreter, and AWQ experts (AutoAWQ itself,
and round-to-nearest packing) against transformers running the dequantized weights."""
import os
import shutil

import pytest
import torch

import llm_kernels

from engine import LLM, SamplingParams
from engine.distributed import TPGroup
from engine.errors import UnsupportedModelError
from engine.model import registry
from engine.model.layers.moe import FusedMoE
from engine.model.loader import load_weights, read_model_spec
from engine.model.qwen3_moe import Qwen3MoeForCausalLM, SparseMoeBlock
from tests import models
from tests.engine.test_parity import LENGTHS, MAX_NEW, check_greedy_parity, random_prompts, reference
from tests.engine.test_parity import run_engine as run

MOE = dict(num_hidden_layers=3, intermediate_size=96, head_dim=32, num_experts=8, num_experts_per_tok=2,
           moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[1])  # layers 0, 2 sparse; 1 dense


def test_registered():
    assert registry.ARCHITECTURES["Qwen3MoeForCausalLM"] is Qwen3MoeForCausalLM


@pytest.fixture(scope="module")
def moe_dir(ckpt_dir):
    return models.make_checkpoint(str(ckpt_dir / "qwen3-moe"), "qwen3_moe", seed=11, norm_topk_prob=True, **MOE)


@pytest.fixture(scope="module")
def moe_plain_dir(ckpt_dir):
    """norm_topk_prob False: the top-k probabilities weigh the experts as they are."""
    return models.make_checkpoint(str(ckpt_dir / "qwen3-moe-plain"), "qwen3_moe", seed=12, norm_topk_prob=False,
                                  **MOE)


@pytest.mark.parametrize("norm", [True, False])
def test_sparse_block_matches_transformers(norm):
    """Router logits, the chosen experts and the block's output of transformers' own
    Qwen3MoeSparseMoeBlock, its fused parameters loaded as they are."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                         norm_topk_prob=norm)
    torch.manual_seed(0)
    hf = Qwen3MoeSparseMoeBlock(cfg).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, 0, 0.2)
    spec = Qwen3MoeForCausalLM.spec_from_config(models.tiny_config("qwen3_moe", 100, norm_topk_prob=norm, architectures=["Qwen3MoeForCausalLM"], **MOE))
    ours = SparseMoeBlock(spec, spec.extra["moe"], "model.layers.0.mlp.", torch.float32, "cpu", TPGroup())
    ours.gate.load(0, "weight", hf.gate.weight.data)
    ours.experts.load("gate_up_proj", "weight", hf.experts.gate_up_proj.data)
    ours.experts.load("down_proj", "weight", hf.experts.down_proj.data)
    assert not ours.experts.expected() - ours.experts.loaded
    x = torch.randn(50, 64)
    with torch.no_grad():
        logits, weights, ids = hf.gate(x)
        want = hf(x[None])[0]
        got = ours(x)
    assert torch.equal(ours.gate(x), logits)
    from engine.model.layers.moe import select_experts

    w, i = select_experts(logits, 2, norm)
    assert torch.equal(i, ids) and torch.equal(w, weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_sparse_layers_follow_the_config(moe_dir):
    llm = LLM(moe_dir, num_kv_blocks=32)
    kinds = [type(layer.mlp).__name__ for layer in llm.engine.model.layers]
    assert kinds == ["SparseMoeBlock", "MLP", "SparseMoeBlock"]
    assert llm.engine.model.layers[1].mlp.gate_up_proj.output_sizes == [96, 96]


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_greedy_matches_transformers(moe_dir, block_size):
    check_greedy_parity(moe_dir, block_size)


def test_chunked_prefill_with_prefix_caching_matches(moe_dir):
    prompts = random_prompts(21, 400, lengths=[1, 9, 30, 64, 120, 200, 3, 47], shared_prefix=40)
    llm = LLM(moe_dir, block_size=16, num_kv_blocks=256, max_num_batched_tokens=40, enable_prefix_caching=True)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params)  # fills the prefix cache
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    stats = llm.stats()
    assert stats["prefix_cache_hit_tokens"] >= 32 and stats["num_steps"] > sum(map(len, prompts)) // 40
    assert first[0].outputs[0].token_ids == outs[0].outputs[0].token_ids
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == reference(moe_dir, prompt), f"prompt of {len(prompt)} tokens"


def test_unnormalised_top_k_matches_transformers(moe_plain_dir):
    prompts = random_prompts(5, 400, lengths=LENGTHS[::2])
    got, _ = run(moe_plain_dir, prompts, block_size=16, num_kv_blocks=128)
    for prompt, tokens in zip(prompts, got):
        assert tokens == reference(moe_plain_dir, prompt)


def _rewrite(src, dst, edit):
    """A copy of checkpoint src with its tensors edited: edit(dict) -> dict."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    f = os.path.join(dst, "model.safetensors")
    save_file(edit(load_file(f)), f)
    return str(dst)


def _fuse_experts(sd):
    """Per-expert tensors -> transformers' fused experts.gate_up_proj / experts.down_proj."""
    out = {k: v for k, v in sd.items() if ".experts." not in k}
    layers = sorted({k.split(".experts.")[0] for k in sd if ".experts." in k})
    for base in layers:
        n = 1 + max(int(k.split(".experts.")[1].split(".")[0]) for k in sd if k.startswith(base + ".experts."))
        out[base + ".experts.gate_up_proj"] = torch.stack(
            [torch.cat([sd[f"{base}.experts.{e}.gate_proj.weight"], sd[f"{base}.experts.{e}.up_proj.weight"]])
             for e in range(n)])
        out[base + ".experts.down_proj"] = torch.stack([sd[f"{base}.experts.{e}.down_proj.weight"] for e in range(n)])
    return out


def test_fused_expert_tensors_load_the_same_model(moe_dir, tmp_path):
    fused = _rewrite(moe_dir, tmp_path / "fused", _fuse_experts)
    prompt = random_prompts(3, 400, lengths=[33])
    assert run(fused, prompt, num_kv_blocks=64)[0] == run(moe_dir, prompt, num_kv_blocks=64)[0]


def test_expert_names_are_routed_to_the_fused_module(moe_dir):
    model = _model(moe_dir)
    assert model.route_weight("layers.2.mlp.experts.7.up_proj.weight") == ("layers.2.mlp.experts", (7, 1), "weight")
    assert model.route_weight("layers.0.mlp.experts.0.down_proj.qzeros") == ("layers.0.mlp.experts", (0, 2), "qzeros")
    assert model.route_weight("layers.0.mlp.experts.gate_up_proj") == ("layers.0.mlp.experts", "gate_up_proj", "weight")
    assert model.route_weight("layers.0.mlp.experts.down_proj") == ("layers.0.mlp.experts", "down_proj", "weight")
    assert model.route_weight("layers.1.mlp.gate_proj.weight") is None  # the dense layer: default routing
    assert model.route_weight("layers.0.mlp.gate.weight") is None  # the router: a plain Linear


def _model(path):
    spec = read_model_spec(path)
    return Qwen3MoeForCausalLM(spec, torch.float32, "cpu", max_positions=64)


def _tensors(path):
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


def test_missing_or_misshapen_expert_tensors_are_named(moe_dir):
    sd = _tensors(moe_dir)
    missing = {k: v for k, v in sd.items() if k != "model.layers.2.mlp.experts.5.up_proj.weight"}
    with pytest.raises(ValueError, match=r"layers\.2\.mlp\.experts \(\(5, 1\), 'weight'\)"):
        load_weights(_model(moe_dir), missing.items())
    bad = dict(sd, **{"model.layers.0.mlp.experts.3.down_proj.weight": torch.zeros(64, 16)})
    with pytest.raises(ValueError, match=r"experts\.3\.down_proj\.weight: checkpoint shape \(64, 16\)"):
        load_weights(_model(moe_dir), bad.items())
    extra = dict(sd, **{"model.layers.0.mlp.experts.8.down_proj.weight": torch.zeros(64, 32)})
    with pytest.raises(ValueError, match="experts.8"):
        load_weights(_model(moe_dir), extra.items())


def test_tensor_parallelism_is_refused_naming_moe(moe_dir):
    spec = read_model_spec(moe_dir)
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        Qwen3MoeForCausalLM.tp_rules(spec)
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        FusedMoE(8, 64, 32, torch.float32, "cpu", tp=TPGroup(0, 2))
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        LLM(moe_dir, num_kv_blocks=32, tensor_parallel_size=2)


def test_dummy_weights_run(moe_dir):
    llm = LLM(moe_dir, num_kv_blocks=32, load_format="dummy")
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


def test_triton_path_through_the_engine_matches(moe_dir, monkeypatch):
    """Every kernel interpreted (fused_moe's sort and grouped GEMMs included): one short prompt."""
    prompt = random_prompts(8, 400, lengths=[19])[0]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    llm = LLM(moe_dir, block_size=16, num_kv_blocks=16)
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=4, temperature=0))
    monkeypatch.delenv("TRITON_INTERPRET")
    assert out[0].outputs[0].token_ids == reference(moe_dir, prompt)[:4]


# ----------------------------------------------------------------------------
# AWQ experts

AWQ_SHAPES = dict(MOE, num_hidden_layers=2, hidden_size=128, intermediate_size=128, moe_intermediate_size=128)


def _autoawq(src: str, dst: str, group: int) -> str:
    """AutoAWQ's own quantization. transformers 5 keeps a layer's experts as one fused
    module that AutoAWQ 0.2.9 cannot iterate ("'Qwen3MoeExperts' object is not
    iterable"): they are split back into transformers 4's per-expert MLPs first."""
    pytest.importorskip("awq", reason="autoawq (the quant extra) is needed to make AWQ checkpoints")
    from awq import AutoAWQForCausalLM
    from transformers import AutoTokenizer
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeMLP

    class ExpertList(torch.nn.ModuleList):
        """Per-expert MLPs, called as transformers 5's fused experts (hidden, top_k_index, top_k_weights)."""

        def forward(self, hidden, top_k_index, top_k_weights):
            out = torch.zeros_like(hidden)
            for e, expert in enumerate(self):
                tok, slot = torch.where(top_k_index == e)
                if tok.numel():
                    out.index_add_(0, tok, expert(hidden[tok]) * top_k_weights[tok, slot, None])
            return out

    if os.path.exists(os.path.join(dst, "config.json")):
        return dst
    model = AutoAWQForCausalLM.from_pretrained(src, device_map="cpu")
    cfg, inter = model.model.config, model.model.config.moe_intermediate_size
    for layer in model.model.model.layers:
        fused = getattr(layer.mlp, "experts", None)
        if fused is None:
            continue
        experts = ExpertList(Qwen3MoeMLP(cfg, intermediate_size=inter) for _ in range(cfg.num_experts))
        for e, m in enumerate(experts):
            m.gate_proj.weight.data.copy_(fused.gate_up_proj.data[e, :inter])
            m.up_proj.weight.data.copy_(fused.gate_up_proj.data[e, inter:])
            m.down_proj.weight.data.copy_(fused.down_proj.data[e])
        layer.mlp.experts = experts
    tok = AutoTokenizer.from_pretrained(src)
    calib = list(models.TOKENIZER_TEXT) * 6
    model.quantize(tok, quant_config={"zero_point": True, "q_group_size": group, "w_bit": 4, "version": "GEMM"},
                   calib_data=calib, max_calib_seq_len=32, max_calib_samples=len(calib))
    model.save_quantized(dst)
    tok.save_pretrained(dst)
    return dst


@pytest.fixture(scope="module", params=["autoawq-64", "rtn-32", "rtn-128"])
def awq_pair(request, ckpt_dir):
    """(the float checkpoint, its AWQ checkpoint, group): AutoAWQ's, or round-to-nearest packing."""
    src = models.make_checkpoint(str(ckpt_dir / "qwen3-moe-128"), "qwen3_moe", seed=13, **AWQ_SHAPES)
    how, group = request.param.split("-")
    dst = str(ckpt_dir / f"qwen3-moe-128-{request.param}")
    make = _autoawq if how == "autoawq" else models.round_to_nearest_awq
    return src, make(src, dst, int(group)), int(group)


def _dequantize(qweight, qzeros, scales, group):
    """[K, N] float32: AutoAWQ's own dequantization when it is installed."""
    try:
        from awq.utils.packing_utils import dequantize_gemm
    except ImportError:
        from llm_kernels import awq_dequantize

        return awq_dequantize(qweight, qzeros, scales.float(), group, torch.float32)
    return dequantize_gemm(qweight, qzeros, scales.float(), 4, group)


def _hf_dequantized(src: str, awq_dir: str, group: int):
    """transformers' float model of src with every quantized weight (experts included)
    the AWQ checkpoint's, dequantized, and its other tensors (norms AutoAWQ scaled)."""
    import re

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    sd, params = _tensors(awq_dir), dict(model.named_parameters())
    inter = model.config.moe_intermediate_size
    for base in [k[: -len(".qweight")] for k in sd if k.endswith(".qweight")]:
        w = _dequantize(sd[base + ".qweight"], sd[base + ".qzeros"], sd[base + ".scales"], group).t()
        m = re.match(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj$", base)
        if m is None:
            params[base + ".weight"].data.copy_(w)
        elif m[3] == "down":
            params[m[1] + ".down_proj"].data[int(m[2])] = w
        else:
            j = m[3] == "up"
            params[m[1] + ".gate_up_proj"].data[int(m[2]), j * inter : (j + 1) * inter] = w
    for name, t in sd.items():
        if name in params:
            params[name].data.copy_(t.float())
    return model


def test_awq_experts_match_transformers_dequantized(awq_pair):
    src, dst, group = awq_pair
    hf = _hf_dequantized(src, dst, group)
    llm = LLM(dst, num_kv_blocks=128, block_size=16)
    assert llm.engine.spec.quant_group_size == group
    block = llm.engine.model.layers[0].mlp
    assert block.experts.quant is not None and block.gate.method.__class__.__name__ == "Dense"
    prompts = random_prompts(17, 400, lengths=[1, 6, 30, 77])
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0))
    for ids, out in zip(prompts, outs):
        gen = out.outputs[0].token_ids
        with torch.no_grad():  # teacher-forced: transformers scores our continuation
            logprobs = hf(torch.tensor([ids + gen])).logits[0].log_softmax(-1)[len(ids) - 1 : -1]
        assert gen == logprobs.argmax(-1).tolist(), f"prompt of {len(ids)} tokens"
        ours = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, gen)])
        torch.testing.assert_close(ours, logprobs[torch.arange(len(gen)), gen], rtol=0, atol=1e-4)


def test_awq_experts_triton_equals_dense(awq_pair, monkeypatch):
    """The CPU runs a dequantized copy; the interpreted int4 grouped GEMMs give the same block output."""
    _, dst, _ = awq_pair
    block = LLM(dst, num_kv_blocks=16).engine.model.layers[0].mlp
    x = torch.randn(13, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        dense = block(x)
        block.experts.dense = None
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        triton = block(x)
    err = ((triton - dense).norm() / dense.norm()).item()
    assert err < 1e-5, err


def test_awq_experts_are_repacked_at_load_where_triton_runs(awq_pair, monkeypatch):
    """Where the Triton kernels run (a GPU; here the interpreter) finalize repacks the experts
    into the kpack layout and frees the checkpoint's buffers; the block's output is the CPU's
    (dequantized) one."""
    _, dst, _ = awq_pair
    x = torch.randn(13, 128, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        dense = LLM(dst, num_kv_blocks=16).engine.model.layers[0].mlp(x)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    block = LLM(dst, num_kv_blocks=16).engine.model.layers[0].mlp
    experts = block.experts
    assert experts.dense is None and all(isinstance(w, llm_kernels.KPackExperts) for w in experts.kpack)
    assert experts.kpack[0].shape == (experts.num_experts, 2 * 128, 128)
    assert experts.w13_qweight.numel() == 0 and experts.w2_scales.numel() == 0
    with torch.no_grad():
        got = block(x)
    err = ((got - dense).norm() / dense.norm()).item()
    assert err < 1e-5, err


def test_awq_dummy_weights_run(awq_pair):
    _, dst, _ = awq_pair
    llm = LLM(dst, num_kv_blocks=32, load_format="dummy")
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3
