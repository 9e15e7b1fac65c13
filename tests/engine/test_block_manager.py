"""Block manager properties (hypothesis): no leaks, no double frees, ref
counts equal the block tables holding each block, prefix hits are exact."""
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_manager import RELEASED, BlockManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

PARAMS = SamplingParams(max_tokens=8)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.integers(1, 40), st.integers(0, 3)),  # prompt length, prefix family
        st.tuples(st.just("append"), st.integers(0, 10), st.integers(1, 20)),  # which seq, how many tokens
        st.tuples(st.just("free"), st.integers(0, 10), st.just(0)),
        st.tuples(st.just("release"), st.integers(0, 10), st.integers(1, 30)),  # which seq, window
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, num_blocks=st.integers(1, 24), block_size=st.sampled_from([2, 4, 8]), caching=st.booleans())
def test_random_operations_keep_invariants(ops, num_blocks, block_size, caching):
    bm = BlockManager(num_blocks, block_size, caching)
    live: list[Sequence] = []
    n = 0
    for op, a, b in ops:
        if op == "new":
            family = [100 * b + i for i in range(40)]  # prompts of a family share prefixes
            seq = Sequence(f"r{n}", None, family[:a], PARAMS, 8)
            n += 1
            hits = bm.get_computed_blocks(seq)
            for i, bid in enumerate(hits):  # a hit holds exactly these tokens
                assert bm.blocks[bid].token_ids == tuple(seq.token_ids[i * block_size : (i + 1) * block_size])
            assert len(hits) * block_size < seq.num_tokens
            free_before = bm.num_free_blocks
            todo = seq.num_tokens - len(hits) * block_size
            if bm.allocate_slots(seq, todo, hits):
                seq.num_computed_tokens = seq.num_tokens
                bm.cache_full_blocks(seq)
                live.append(seq)
            else:
                assert bm.num_free_blocks == free_before and not seq.block_table
        elif op == "append" and live:
            seq = live[a % len(live)]
            seq.token_ids.extend(range(seq.num_tokens, seq.num_tokens + b))
            if bm.allocate_slots(seq, seq.num_tokens - seq.num_computed_tokens):
                seq.num_computed_tokens = seq.num_tokens
                bm.cache_full_blocks(seq)
            else:
                del seq.token_ids[-b:]
        elif op == "free" and live:
            bm.free_seq(live.pop(a % len(live)))
        elif op == "release" and live:
            seq = live[a % len(live)]
            bm.release_outside_window(seq, b)
            for i, bid in enumerate(seq.block_table):  # released: a prefix, and every block wholly below the window
                assert (bid == RELEASED) == (i < seq.num_released_blocks)
                if (i + 1) * block_size - 1 <= seq.num_computed_tokens - b:
                    assert bid == RELEASED
        bm.check_invariants(live)
        held = {x for s in live for x in s.block_table if x != RELEASED}
        assert bm.num_free_blocks + len(held) == num_blocks
        for s in live:
            assert len(s.block_table) == -(-s.num_computed_tokens // block_size)
    for s in live:
        bm.free_seq(s)
    bm.check_invariants([])
    assert bm.num_free_blocks == num_blocks


def test_double_free_is_caught():
    bm = BlockManager(4, 4)
    seq = Sequence("a", None, [1, 2, 3, 4, 5], PARAMS, 8)
    assert bm.allocate_slots(seq, 5)
    table = list(seq.block_table)
    bm.free_seq(seq)
    seq.block_table = table
    try:
        bm.free_seq(seq)
    except AssertionError as exc:
        assert "double free" in str(exc)
    else:
        raise AssertionError("a double free went unnoticed")


def test_hash_collision_does_not_return_other_tokens(monkeypatch):
    import engine.block_manager as bmmod

    monkeypatch.setattr(bmmod, "block_hash", lambda parent, tokens, salt: 42)  # everything collides
    bm = BlockManager(8, 4)
    a = Sequence("a", None, [1, 2, 3, 4, 5, 6, 7, 8, 9], PARAMS, 8)
    assert bm.allocate_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.cache_full_blocks(a)
    b = Sequence("b", None, [9, 9, 9, 9, 5, 6, 7, 8, 9], PARAMS, 8)
    assert bm.get_computed_blocks(b) == []  # same hash, other tokens: no hit
    c = Sequence("c", None, [1, 2, 3, 4, 0], PARAMS, 8)
    assert len(bm.get_computed_blocks(c)) == 1


def test_freed_cached_blocks_are_reused_lru_and_uncached_first():
    bm = BlockManager(6, 2)
    a = Sequence("a", None, [1, 2, 3, 4, 5], PARAMS, 8)  # 3 blocks, 2 full
    assert bm.allocate_slots(a, 5)
    a.num_computed_tokens = 5
    bm.cache_full_blocks(a)
    full = a.block_table[:2]
    bm.free_seq(a)
    b = Sequence("b", None, [7, 7, 7], PARAMS, 8)  # needs 2 fresh blocks
    assert bm.allocate_slots(b, 3)
    assert not set(b.block_table) & set(full), "cached blocks were evicted while uncached ones were free"
    c = Sequence("c", None, [1, 2, 3, 4, 9], PARAMS, 8)
    assert bm.get_computed_blocks(c) == full


def _cached_seq(bm, rid, tokens, salt=None):
    s = Sequence(rid, None, tokens, PARAMS, 8, cache_salt=salt)
    hits = bm.get_computed_blocks(s)
    assert bm.allocate_slots(s, s.num_tokens - len(hits) * bm.block_size, hits)
    s.num_computed_tokens = s.num_tokens
    bm.cache_full_blocks(s)
    return s, len(hits)


def test_cache_salt_isolates_prefixes():
    bm = BlockManager(16, 4)
    a, _ = _cached_seq(bm, "a", list(range(1, 10)), salt="tenant-1")
    bm.free_seq(a)
    _, other = _cached_seq(bm, "b", list(range(1, 10)), salt="tenant-2")
    _, same = _cached_seq(bm, "c", list(range(1, 10)), salt="tenant-1")
    assert other == 0 and same == 2


def test_cached_blocks_expire_after_ttl():
    now = [100.0]
    bm = BlockManager(16, 4, ttl_s=30, clock=lambda: now[0])
    a, _ = _cached_seq(bm, "a", list(range(1, 10)))
    bm.free_seq(a)
    now[0] += 10
    b, hits = _cached_seq(bm, "b", list(range(1, 10)))
    assert hits == 2
    bm.free_seq(b)
    now[0] += 31
    assert len(bm.expire()) == 2 and not bm.cached
    _, hits = _cached_seq(bm, "c", list(range(1, 10)))
    assert hits == 0


def test_hash_collision_across_salts_is_no_hit(monkeypatch):
    import engine.block_manager as bmmod

    monkeypatch.setattr(bmmod, "block_hash", lambda parent, tokens, salt: 42)  # the salt changes no hash
    bm = BlockManager(16, 4)
    a, _ = _cached_seq(bm, "a", list(range(1, 10)), salt="tenant-1")
    bm.free_seq(a)
    _, other = _cached_seq(bm, "b", list(range(1, 10)), salt="tenant-2")
    assert other == 0  # same tokens, same hash, another salt: the block records its salt


def test_release_outside_window_frees_only_what_no_query_sees():
    """Window 10, block 4, 23 tokens computed (next query at 23 sees keys 14..23): blocks
    0..2 (tokens 0..11) go, block 3 (12..15) stays; a full released block stays cached,
    so another sequence with the same prefix still hits it; free_seq skips the released."""
    bm = BlockManager(12, 4, enable_prefix_caching=True)
    seq = Sequence("a", None, list(range(23)), PARAMS, 8)
    assert bm.allocate_slots(seq, 23)
    seq.num_computed_tokens = 23
    bm.cache_full_blocks(seq)
    held = list(seq.block_table)
    assert bm.release_outside_window(seq, 10) == 3
    assert seq.block_table[:3] == [RELEASED] * 3 and seq.block_table[3:] == held[3:]
    assert bm.num_free_blocks == 12 - 3
    assert bm.release_outside_window(seq, 10) == 0  # idempotent
    bm.check_invariants([seq])
    other = Sequence("b", None, list(range(23)), PARAMS, 8)
    assert bm.get_computed_blocks(other)[:3] == held[:3]  # still in the prefix cache
    bm.free_seq(seq)
    bm.check_invariants([])
    assert bm.num_free_blocks == 12 and seq.num_released_blocks == 0
