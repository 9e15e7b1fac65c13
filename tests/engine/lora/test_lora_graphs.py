"""With adapters enabled, a step of base model requests only runs no LoRA kernel: eagerly, and
from the graph without them (each decode batch size and mixed token count has one graph with
the LoRA kernels and one without); a step with an adapter's row runs them. The graphs'
replays are stood in for by their forwards over the persistent inputs (what a capture records),
as tests/engine/test_mixed_graphs.py does; the captured graphs are checked on the GPU
(tests/gpu/test_lora_engine_gpu.py)."""
import pytest

import llm_kernels
from engine import LLM, LoRARequest, SamplingParams
from engine.cuda_graph import DecodeGraphs
from engine.mixed_graphs import MixedGraphs

PROMPTS = [list(range(5, 45)), [9, 8, 7, 6, 5, 9, 8, 7], [300, 200, 100] * 5]
KW = dict(enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=128, max_num_seqs=4,
          max_num_batched_tokens=32)


class EagerDecode(DecodeGraphs):
    """Decode graphs whose replay runs the forward they would have captured, eagerly."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.replayed = []  # (batch, adapters) a replay

    def replay(self, bs, adapters=False):
        self.replayed.append((bs, adapters))
        return self._forward(bs, adapters)


class EagerMixed(MixedGraphs):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.replayed = []  # (tokens, adapters) a replay

    def replay(self, tb, adapters=False):
        self.replayed.append((tb, adapters))
        self.replays += 1
        return self._forward(tb, adapters)


@pytest.fixture
def lora_calls(monkeypatch):
    """The token counts of every add_lora call."""
    calls = []
    real = llm_kernels.add_lora

    def counted(out, *a, **k):
        calls.append(out.shape[0])
        return real(out, *a, **k)

    monkeypatch.setattr(llm_kernels, "add_lora", counted)
    return calls


def run(llm, loras, max_tokens=(8, 8, 8)):
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=1) for n in max_tokens],
                        lora_request=loras)
    return [(o.outputs[0].token_ids, [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outs]


def same(got, want):
    for (g_ids, g_lp), (w_ids, w_lp) in zip(got, want):
        assert g_ids == w_ids
        assert max(abs(a - b) for a, b in zip(g_lp, w_lp)) < 1e-4


def test_base_model_steps_run_no_lora_kernel(tiny_llama_dir, adapters, lora_calls):
    plain = LLM(tiny_llama_dir, **{**KW, "enable_lora": False})
    want = run(plain, None)
    assert not lora_calls
    llm = LLM(tiny_llama_dir, **KW)
    lora_calls.clear()
    same(run(llm, None), want)  # base requests on an engine with adapters: the plain engine's output
    assert not lora_calls
    run(llm, [LoRARequest("all", 1, adapters["all"]), None, None])
    assert lora_calls  # a step with an adapter's rows runs the kernels


def test_graphs_with_and_without_adapters(tiny_llama_dir, adapters):
    eager = LLM(tiny_llama_dir, **KW)
    loras = [LoRARequest("all", 1, adapters["all"]), None, LoRARequest("mlp", 3, adapters["mlp"])]
    lengths = (4, 16, 6)  # the base request decodes alone after the adapted ones end
    want_base, want_mixed = run(eager, None), run(eager, loras, lengths)
    llm = LLM(tiny_llama_dir, **KW)
    runner = llm.engine.runner
    runner.graphs = EagerDecode(runner.model, runner.device, 4, runner.max_blocks_per_seq, lora=True)
    runner.mixed = EagerMixed(runner.model, runner.device, 32, runner.max_num_seqs, runner.max_blocks_per_seq,
                              lora=True)
    assert runner.graphs.variants == runner.mixed.variants == (True, False)
    same(run(llm, None), want_base)
    assert runner.graphs.replayed and runner.mixed.replayed
    assert not any(a for _, a in runner.graphs.replayed + runner.mixed.replayed)
    runner.graphs.replayed.clear()
    runner.mixed.replayed.clear()
    same(run(llm, loras, lengths), want_mixed)
    # steps with an adapted request's rows replay the graphs with the kernels, the base
    # request's steps alone the ones without
    assert {a for _, a in runner.graphs.replayed} == {True, False}
    assert any(a for _, a in runner.mixed.replayed)
    assert DecodeGraphs(runner.model, runner.device, 4, runner.max_blocks_per_seq).variants == (False,)
