"""Mixed-step graphs (engine.mixed_graphs) on the CPU: the graph's replay is stood in for by
the same forward over the persistent, padded inputs (what a capture records), so the
padding (the extra sequence, the empty slots, tokens past the step's) and the copy-in are
checked against ordinary eager steps: chunked prefill beside decodes, prefix-cache hits,
prompt logprobs, preemption. The captured graphs themselves are checked on the GPU
(tests/gpu/test_engine_gpu.py)."""
import pytest

from engine import LLM, SamplingParams
from engine.mixed_graphs import MixedGraphs, token_ladder

PROMPTS = ["Meeting notes: the team agreed on the budget and the launch date of the product",
           "회의록: 오늘 회의에서는 예산과 일정에 대해 논의했습니다", "The quick brown fox", "Action items:",
           "Meeting notes: the team agreed on the budget and then the schedule", "Paris is"]


class EagerReplay(MixedGraphs):
    """A MixedGraphs whose replay runs the forward it would have captured, eagerly."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.steps = []  # (tokens of the graph, tokens of the step)

    def copy_inputs(self, host, tokens, tb, n_seqs, cols, adapters=False):
        self.steps.append((tb, tokens))
        self.tables[n_seqs:] = 3  # rows past the step's are stale: any real block id
        super().copy_inputs(host, tokens, tb, n_seqs, cols, adapters)

    def replay(self, tb, adapters=False):
        self.replays += 1
        return self._forward(tb, adapters)


def test_token_ladder():
    assert token_ladder(512) == [16, 32, 64, 128, 192, 256, 320, 384, 448, 512]
    assert token_ladder(100) == [16, 32, 64, 100]
    assert token_ladder(16) == [16]
    assert token_ladder(8) == [8]


@pytest.fixture(scope="module")
def engines(tiny_llama_dir):
    """The same model twice with a small token budget (chunked prefill beside decodes): one
    whose prefill and mixed steps go through EagerReplay, one plain."""
    kw = dict(num_kv_blocks=40, block_size=8, max_num_seqs=6, max_num_batched_tokens=40)
    graphed, plain = LLM(tiny_llama_dir, **kw), LLM(tiny_llama_dir, **kw)
    runner = graphed.engine.runner
    runner.mixed = EagerReplay(runner.model, runner.device, 40, runner.max_num_seqs, runner.max_blocks_per_seq)
    return graphed, plain


def run(llm, params):
    outs = llm.generate(PROMPTS, params)
    stats = llm.engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    return outs


def test_mixed_steps_through_the_padded_inputs_equal_eager(engines):
    graphed, plain = engines
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=2) for n in (3, 14, 1, 20, 9, 6)]
    params[2].prompt_logprobs = 3
    mixed = graphed.engine.runner.mixed
    before = mixed.replays
    got, want = run(graphed, params), run(plain, params)
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for pos_g, pos_w in zip(g.outputs[0].logprobs, w.outputs[0].logprobs):
            assert pos_g.keys() == pos_w.keys()
            assert all(abs(pos_g[t].logprob - pos_w[t].logprob) < 1e-4 for t in pos_g)
    pl_g, pl_w = got[2].prompt_logprobs, want[2].prompt_logprobs
    assert [sorted(p) if p else p for p in pl_g] == [sorted(p) if p else p for p in pl_w]
    steps = mixed.steps[-(mixed.replays - before):]
    assert len(steps) >= 6  # every prompt's chunks, most beside decodes
    assert any(tb > tokens for tb, tokens in steps)  # padded: the extra sequence was exercised
    assert all(tb == min(t for t in mixed.sizes if t >= tokens) for tb, tokens in steps)


def test_preemption_and_prefix_hits_through_the_padded_inputs(engines, tiny_llama_dir):
    """A KV cache too small for every request at once (recomputed after preemption) and prompts
    sharing a prefix (their chunks start past the cached blocks)."""
    graphed, plain = engines
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    got, want = run(graphed, params), run(plain, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    small = LLM(tiny_llama_dir, num_kv_blocks=14, block_size=8, max_num_seqs=6, max_num_batched_tokens=24)
    r = small.engine.runner
    r.mixed = EagerReplay(r.model, r.device, 24, r.max_num_seqs, r.max_blocks_per_seq)
    outs = small.generate(PROMPTS, params)
    assert small.engine.stats()["num_preemptions"] > 0
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in want]


def test_steps_beyond_the_graphs_run_eagerly(engines):
    """A step of more tokens than the largest graph, or of every sequence slot, is not replayed."""
    graphed, _ = engines
    mixed = graphed.engine.runner.mixed
    assert mixed.can_run(40, 6) and not mixed.can_run(41, 1) and not mixed.can_run(8, 7)
    assert mixed.padded_tokens(17) == 32 and mixed.padded_tokens(40) == 40
