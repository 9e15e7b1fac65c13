"""Scheduler: one token budget per step (decodes first, then prefill chunks),
max_num_seqs, priority then arrival order, preemption of the latest/lowest."""
from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

P = SamplingParams(max_tokens=8)


def seq(rid, n, priority=0):
    return Sequence(rid, None, list(range(1, n + 1)), P, 8, priority=priority)


def advance(sched, out, sample=True):
    """What the engine does after a step: tokens computed, one sampled where the prompt is done."""
    for s, n in out.scheduled:
        s.num_computed_tokens += n
        if sample and s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(7)


def test_budget_decodes_first_then_chunks():
    sched = Scheduler(BlockManager(64, 4, False), max_num_seqs=8, max_num_batched_tokens=10)
    a, b = seq("a", 3), seq("b", 30)
    sched.add(a)
    advance(sched, sched.schedule())  # a prefilled
    sched.add(b)
    out = sched.schedule()
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 1), ("b", 9)]
    assert out.num_batched_tokens == 10
    advance(sched, out)
    out = sched.schedule()
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 1), ("b", 9)]


def test_max_num_seqs_and_priority_order():
    sched = Scheduler(BlockManager(64, 4, False), max_num_seqs=2, max_num_batched_tokens=100)
    for s in (seq("low", 4, priority=5), seq("mid", 4, priority=1), seq("high", 4, priority=0), seq("mid2", 4, 1)):
        sched.add(s)
    out = sched.schedule()
    assert [s.request_id for s, _ in out.scheduled] == ["high", "mid"]
    assert [s.request_id for s in sched.waiting] == ["mid2", "low"]


def test_preemption_takes_the_latest_and_puts_it_first_in_line():
    bm = BlockManager(4, 4, False)  # 16 slots
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    a, b = seq("a", 7), seq("b", 8)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert len(out.scheduled) == 2 and bm.num_free_blocks == 0
    advance(sched, out)
    late = seq("c", 2)
    sched.add(late)
    out = sched.schedule()  # a needs no block (8 tokens); b needs a 3rd block: b is the victim
    assert [s.request_id for s in out.preempted] == ["b"]
    assert [s.request_id for s in sched.waiting] == ["b", "c"]
    assert b.num_computed_tokens == 0 and not b.block_table and b.num_tokens == 9
    assert sched.num_preemptions == 1
    assert b.preempted_time is not None and a.preempted_time is None  # it waits again from then


def test_queued_since_is_the_arrival_then_the_last_preemption(tiny_llama_dir):
    """The engine's word on queueing (QUEUE_TIMEOUT_S): a request with no step run waits since its
    arrival, one that runs does not wait, one preempted waits again since its preemption."""
    from engine import LLM

    llm = LLM(tiny_llama_dir, num_kv_blocks=4, block_size=16, max_model_len=64, enable_prefix_caching=False)
    eng = llm.engine
    grow = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    eng.add_request("a", {"prompt_token_ids": [5] * 12}, grow)
    eng.add_request("b", {"prompt_token_ids": [6] * 12}, grow)
    arrived = eng.queued_since("b")
    assert arrived is not None and eng.queued_since("unknown") is None
    eng.step()
    assert eng.queued_since("a") is None and eng.queued_since("b") is None  # both run
    while not eng.scheduler.num_preemptions:  # 4 blocks: the two cannot both reach 40 tokens
        eng.step()
    (victim,) = [r for r in ("a", "b") if eng.queued_since(r) is not None]
    assert eng.queued_since(victim) > arrived
    while eng.has_unfinished_requests():
        eng.step()


def test_update_from_output_advances_caches_and_appends():
    """After a step: computed tokens advance, full blocks enter the prefix cache, a
    sample appends its token (a chunk that samples nothing, or a NaN sample, appends none)."""
    from engine.sampler import SampleResult

    bm = BlockManager(16, 4, True)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=6)
    a, b, c = seq("a", 3), seq("b", 9), seq("c", 2)
    for s in (a, b, c):
        sched.add(s)
    out = sched.schedule()
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 3), ("b", 3)]
    assert a.first_scheduled_time is not None and c.first_scheduled_time is None
    sampled = sched.update_from_output(out.scheduled, [SampleResult(11, -0.5, None), None])
    assert [(s.request_id, r.token_id) for s, r in sampled] == [("a", 11)]
    assert a.token_ids == [1, 2, 3, 11] and a.cumulative_logprob == -0.5 and a.first_token_time is not None
    assert b.num_computed_tokens == 3 and b.token_ids == list(range(1, 10)) and b.first_token_time is None
    assert len(bm.cached) == 0  # no block is full yet
    out = sched.schedule()
    sampled = sched.update_from_output(out.scheduled, [SampleResult(-1, 0.0, None, error="nan")
                                                       if s is a else None for s, _ in out.scheduled])
    assert [s.request_id for s, _ in sampled] == ["a"] and a.token_ids == [1, 2, 3, 11]
    assert a.num_computed_tokens == 4 and len(bm.cached) >= 1  # a's first block is full and computed
    stats = sched.stats()
    assert (stats["num_running"], stats["num_waiting"], stats["kv_blocks_total"]) == (2, 1, 16)
