"""An FP8 model (quant_method "fp8", per-tensor weight scales, activations quantized per token)
whose linears run W8A8 on the Triton kernels under the interpreter: the norms before q/k/v and
gate/up and the activation before down quantize their outputs in their own launches and hand
them over, o_proj (fed by attention) quantizes its own, and the greedy tokens and logprobs are
those of the same model with every linear quantizing its own input (the same bytes)."""
import pytest

from engine import LLM, SamplingParams
from engine.model.layers import quantized_input
from llm_kernels.fp8 import weight as fp8_weight
from llm_kernels.fp8 import w8a16
from tests import models, quant_models


@pytest.fixture(scope="module")
def fp8_tensor_model(ckpt_dir):
    base = models.make_checkpoint(str(ckpt_dir / "llama128-fused"), "llama", seed=9, hidden_size=128,
                                  intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    return quant_models.fp8_block_checkpoint(base, str(ckpt_dir / "fp8-tensor"), block=None)[0]


def run(path, monkeypatch, fused: bool):
    """(tokens and logprobs of three greedy requests, the W8A8 launches as (N, K, handed over))."""
    launches = []
    real = w8a16.launch

    def launch(x, weight, *a, xq=None, **kw):
        launches.append((weight.shape[0], weight.shape[1], xq is not None))
        return real(x, weight, *a, xq=xq, **kw)

    monkeypatch.setattr(w8a16, "launch", launch)
    if not fused:
        monkeypatch.setattr(quantized_input, "wants_quantized_input", lambda w, x: False)
    llm = LLM(path, num_kv_blocks=64, block_size=16)
    prompts = [{"prompt_token_ids": list(range(5 + 7 * i, 5 + 7 * i + n))} for i, n in enumerate((3, 19, 8))]
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0, logprobs=1))
    got = [(o.outputs[0].token_ids, [round(max(lp.values()).logprob, 6) for lp in o.outputs[0].logprobs])
           for o in outs]
    monkeypatch.undo()
    return got, launches


def test_fed_linears_take_their_producers_quantization_with_the_same_tokens(fp8_tensor_model, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # every step of a per-token layer on the W8A8 kernel (the interpreter's own list has the weight-only one)
    monkeypatch.setattr(fp8_weight, "candidates", lambda dev, dtype, M, layout: ("w8a8",))
    fused, fused_launches = run(fp8_tensor_model, monkeypatch, fused=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(fp8_weight, "candidates", lambda dev, dtype, M, layout: ("w8a8",))
    own, own_launches = run(fp8_tensor_model, monkeypatch, fused=False)
    assert fused == own
    # (N, K): q/k/v (256, 128) and gate/up (512, 128) after a norm, down (128, 256) after the
    # activation: handed over every time; o_proj (128, 128) after attention: never
    handed = {}
    for n, k, got in fused_launches:
        handed.setdefault((n, k), set()).add(got)
    assert handed == {(256, 128): {True}, (512, 128): {True}, (128, 256): {True}, (128, 128): {False}}, handed
    assert not any(got for *_, got in own_launches) and len(own_launches) == len(fused_launches)
