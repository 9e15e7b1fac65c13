"""Asynchronous scheduling (engine.async_scheduling): decode steps launched before the
previous step's samples reach the host give exactly the outputs of synchronous steps,
drop the samples of requests that ended meanwhile, and step aside for every feature
that needs the host to see a token first."""
import pytest

from engine import LLM, SamplingParams
from engine.sampler import PendingSamples

PROMPTS = ["Meeting notes: the team", "회의록: 오늘", "The quick brown fox", "Action items:", "Paris is",
           "A longer prompt about the budget and the launch date of the product"]


@pytest.fixture(scope="module")
def engines(tiny_llama_dir):
    """The same model twice: with asynchronous scheduling (the default) and without."""
    return (LLM(tiny_llama_dir, num_kv_blocks=96, block_size=8, async_scheduling=True),
            LLM(tiny_llama_dir, num_kv_blocks=96, block_size=8, async_scheduling=False))


def outputs(llm, params, prompts=PROMPTS):
    before = llm.engine.stats()["num_async_steps"]
    outs = llm.generate(prompts, params)
    stats = llm.engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]  # nothing leaked, dropped steps included
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].logprobs)
            for o in outs], stats["num_async_steps"] - before


def same(a, b):
    for (ids_a, text_a, end_a, lp_a), (ids_b, text_b, end_b, lp_b) in zip(a, b):
        assert (ids_a, text_a, end_a) == (ids_b, text_b, end_b)
        if lp_a is not None:
            for pos_a, pos_b in zip(lp_a, lp_b):
                assert pos_a.keys() == pos_b.keys()
                assert all(abs(pos_a[t].logprob - pos_b[t].logprob) < 1e-5 for t in pos_a)


def test_greedy_lengths_and_logprobs_equal_synchronous(engines):
    ahead, sync = engines
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=2) for n in (1, 2, 5, 17, 30, 9)]
    got, launched = outputs(ahead, params)
    want, none = outputs(sync, params)
    same(got, want)
    assert none == 0 and launched >= 25  # the longest request's decode steps ran ahead
    assert [len(ids) for ids, *_ in got] == [1, 2, 5, 17, 30, 9]


def test_seeded_sampling_equals_synchronous(engines):
    ahead, sync = engines
    params = [SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, top_k=20, seed=100 + i, ignore_eos=True)
              for i in range(len(PROMPTS))]
    got, launched = outputs(ahead, params)
    want, _ = outputs(sync, params)
    same(got, want)
    assert launched > 0


def test_stop_strings_and_stop_tokens_drop_the_step_run_ahead(engines):
    """Requests that end on a stop string or a stop token in step t had step t + 1 launched:
    its sample is dropped, the text is the synchronous one, all blocks come back."""
    ahead, sync = engines
    free = sync.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    params = []
    for i, out in enumerate(free):
        ids, text = out.outputs[0].token_ids, out.outputs[0].text
        if i % 2:  # a stop token a few tokens in
            params.append(SamplingParams(max_tokens=24, temperature=0, stop_token_ids=[ids[3 + i]]))
        else:  # a stop string from the middle of the text
            params.append(SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[text[5 + i: 8 + i]]))
    got, launched = outputs(ahead, params)
    want, _ = outputs(sync, params)
    same(got, want)
    assert launched > 0 and {end for _, _, end, _ in got} == {"stop"}
    assert all(len(ids) < 24 for ids, *_ in got)


def test_prefix_cache_after_dropped_steps_is_intact(engines):
    """The KV a dropped step wrote never enters the prefix cache: a prompt that extends
    an earlier request's text hits its cached blocks and continues as without the cache."""
    ahead, sync = engines
    params = SamplingParams(max_tokens=13, temperature=0, ignore_eos=True)
    first = ahead.generate(PROMPTS[5], params)[0]
    longer = {"prompt_token_ids": first.prompt_token_ids + first.outputs[0].token_ids}
    hits = ahead.engine.stats()["prefix_cache_hit_tokens"]
    got = ahead.generate(longer, params)[0]
    assert ahead.engine.stats()["prefix_cache_hit_tokens"] - hits >= 16
    assert got.outputs[0].token_ids == sync.generate(longer, params)[0].outputs[0].token_ids


def test_features_that_need_the_token_run_synchronously(engines):
    ahead, sync = engines
    for params in (SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, repetition_penalty=1.3),
                   SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, frequency_penalty=0.5),
                   SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logit_bias={5: 3.0}),
                   SamplingParams(max_tokens=12, temperature=0, min_tokens=12)):
        got, launched = outputs(ahead, [params] * 3, PROMPTS[:3])
        want, _ = outputs(sync, [params] * 3, PROMPTS[:3])
        same(got, want)
        assert launched == 0
    # min_tokens met: from then on the steps run ahead
    params = SamplingParams(max_tokens=20, temperature=0, min_tokens=4, ignore_eos=True)
    got, launched = outputs(ahead, [params] * 2, PROMPTS[:2])
    same(got, outputs(sync, [params] * 2, PROMPTS[:2])[0])
    assert 0 < launched < 20


def test_next_step_is_launched_before_the_host_waits(engines):
    """In a pipelined step the forward of step t + 1 is queued before step t's samples are
    waited for: the one synchronisation of a step is off the critical path."""
    ahead, _ = engines
    eng = ahead.engine
    events = []
    real_execute, real_result = eng.runner.execute, PendingSamples.result

    def execute(scheduled, **kw):
        events.append(("execute", len(scheduled), kw.get("input_ids") is not None))
        return real_execute(scheduled, **kw)

    def result(self):
        events.append(("wait", len(self.seqs), None))
        return real_result(self)

    eng.runner.execute = execute
    PendingSamples.result = result
    try:
        eng.add_request("a", PROMPTS[0], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
        eng.add_request("b", PROMPTS[1], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        while eng.has_unfinished_requests():
            eng.step()
    finally:
        del eng.runner.execute
        PendingSamples.result = real_result
    kinds = [e[0] for e in events]
    # prefill (synchronous), then a decode launched, then each later launch precedes the wait
    assert kinds[:2] == ["execute", "wait"] and events[2] == ("execute", 2, False)
    for i in range(3, len(events) - 1, 2):
        assert events[i][0] == "execute" and events[i][2] and events[i + 1][0] == "wait"
    assert sum(1 for e in events if e[0] == "execute" and e[2]) >= 3


def test_abort_and_new_requests_while_a_step_is_in_flight(engines):
    ahead, sync = engines
    eng = ahead.engine
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    eng.add_request("x", PROMPTS[2], params)
    eng.add_request("y", PROMPTS[3], params)
    outs = {}
    while eng.ahead.inflight is None or eng.ahead.num_steps < 3:
        for o in eng.step():
            outs[o.request_id] = o
    aborted = eng.abort_request("y")  # its step in flight is dropped when it completes
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    eng.add_request("z", PROMPTS[4], params)  # admitted in the next synchronous step
    while eng.has_unfinished_requests():
        for o in eng.step():
            assert o.request_id != "y"
            outs[o.request_id] = o
    for rid, prompt in (("x", PROMPTS[2]), ("z", PROMPTS[4])):
        assert outs[rid].outputs[0].token_ids == sync.generate(prompt, params)[0].outputs[0].token_ids
    stats = eng.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_async_scheduling_must_be_a_bool(tiny_llama_dir):
    from engine import EngineConfig
    from engine.errors import InvalidInputError

    with pytest.raises(InvalidInputError) as e:
        EngineConfig(model=tiny_llama_dir, async_scheduling="yes")
    assert e.value.field == "async_scheduling"


def test_out_of_memory_in_a_launch_ahead_falls_back_to_a_synchronous_step(engines):
    """A step that runs out of memory as it is launched ahead (the first of a run, or a
    successor) runs synchronously instead; the outputs stay those of synchronous steps."""
    import torch

    ahead, sync = engines
    eng = ahead.engine
    real = eng.runner.execute
    calls = {"n": 0}

    def execute(scheduled, **kw):
        calls["n"] += 1
        if calls["n"] in (2, 6):  # the first decode step's launch, then a successor's
            raise torch.OutOfMemoryError("injected")
        return real(scheduled, **kw)

    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    eng.runner.execute = execute
    try:
        got, launched = outputs(ahead, [params] * 3, PROMPTS[:3])
    finally:
        del eng.runner.execute
    assert calls["n"] > 8 and launched > 0
    same(got, outputs(sync, [params] * 3, PROMPTS[:3])[0])


def test_requests_that_cannot_be_admitted_yet_let_the_running_ones_go_ahead(tiny_llama_dir):
    """max_num_seqs 2 and 5 requests: three wait while two decode ahead; each waiting one is
    admitted (synchronously) as soon as a place frees, and every output is the synchronous one."""
    kw = dict(num_kv_blocks=96, block_size=8, max_num_seqs=2)
    ahead = LLM(tiny_llama_dir, async_scheduling=True, **kw)
    sync = LLM(tiny_llama_dir, async_scheduling=False, **kw)
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (14, 6, 9, 11, 5)]
    got, launched = outputs(ahead, params, PROMPTS[:5])
    want, _ = outputs(sync, params, PROMPTS[:5])
    same(got, want)
    assert launched >= 16  # 8 when any waiting request stopped them


def test_a_waiting_request_that_fits_is_admitted_at_once(engines):
    """A new request that fits stops the running ones going ahead: the next step admits it
    (no step of the running requests passes before its prefill)."""
    ahead, _ = engines
    eng = ahead.engine
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    eng.add_request("long", PROMPTS[0], params)
    while eng.ahead.inflight is None:
        eng.step()
    eng.add_request("new", PROMPTS[1], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    outs = eng.step()  # completes the step in flight and launches nothing ahead
    assert [o.request_id for o in outs] == ["long"] and eng.ahead.inflight is None
    eng.step()  # the synchronous step that admits it
    assert eng.requests["new"].num_computed_tokens == eng.requests["new"].num_prompt_tokens
    while eng.has_unfinished_requests():
        eng.step()


def test_choices_and_prompt_logprobs_equal_synchronous(engines):
    """n > 1 (the choices join after the prompt) and prompt_logprobs beside plain requests."""
    ahead, sync = engines
    params = [SamplingParams(max_tokens=10, n=3, temperature=0.8, seed=7, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, prompt_logprobs=2, logprobs=1),
              SamplingParams(max_tokens=15, temperature=0, ignore_eos=True)]
    before = ahead.engine.stats()["num_async_steps"]
    got = ahead.generate(PROMPTS[:3], params)
    want = sync.generate(PROMPTS[:3], params)
    assert ahead.engine.stats()["num_async_steps"] > before
    for g, w in zip(got, want):
        assert [c.token_ids for c in g.outputs] == [c.token_ids for c in w.outputs]
        assert [c.text for c in g.outputs] == [c.text for c in w.outputs]
    assert len(got[0].outputs) == 3
    assert [sorted(p) if p else p for p in got[1].prompt_logprobs] == [sorted(p) if p else p
                                                                       for p in want[1].prompt_logprobs]
