"""The forward context is per thread: two engines stepping at once in one process
(each on its own thread, as AsyncLLMEngine steps) neither read nor clear each other's
(CI once failed a worker's warm-up with "model called outside a forward context" while
another test's engine was stepping)."""
import threading

import pytest
import torch

from engine.model.layers import ForwardContext, forward_context, get_forward_context


def _ctx(n: int) -> ForwardContext:
    t = torch.full((n,), n)
    return ForwardContext(slot_mapping=t, block_tables=t.view(1, -1), context_lens=t[:1], query_start_loc=t[:2],
                          is_decode=True)


def test_overlapping_steps_on_two_threads_keep_their_own_context():
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen, errors = {}, []

    def engine_a():
        with forward_context(_ctx(1)):
            a_in.set()
            b_in.wait(5)
        a_out.set()  # A's step ends while B's is still running

    def engine_b():
        a_in.wait(5)
        ctx = _ctx(2)
        with forward_context(ctx):
            b_in.set()
            a_out.wait(5)
            try:
                seen["b"] = get_forward_context()
            except AssertionError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=engine_a), threading.Thread(target=engine_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors, errors
    assert int(seen["b"].slot_mapping[0]) == 2  # B's own, not A's and not cleared by A's exit


def test_nested_contexts_restore_the_outer_one_and_none_outside():
    with pytest.raises(AssertionError, match="outside a forward context"):
        get_forward_context()
    outer, inner = _ctx(3), _ctx(4)
    with forward_context(outer):
        with forward_context(inner):
            assert get_forward_context() is inner
        assert get_forward_context() is outer
    with pytest.raises(AssertionError, match="outside a forward context"):
        get_forward_context()
