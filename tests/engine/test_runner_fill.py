"""ModelRunner.fill_host's decode path (array operations) writes what the row-by-row path
writes: ids (0 for a token still being sampled), positions (longrope's rows), slots, context
lengths, block tables, sample rows, graph padding."""
import random

import numpy as np
import pytest

from engine.block_manager import RELEASED
from engine.runner import HostBuffers, ModelRunner
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


class _Model:
    long_rope = None


def runner(long_rope=None, lora=False) -> ModelRunner:
    r = ModelRunner.__new__(ModelRunner)  # the host side only: no model, no KV cache
    r.block_size, r.model, r.host, r.lora = 8, _Model(), HostBuffers(512, 16, pin=False), lora
    r.model.long_rope = long_rope
    return r


def decode_batch(rng: random.Random) -> list[tuple[Sequence, int]]:
    scheduled = []
    for i in range(9):
        n_tok = rng.randrange(3, 90)
        seq = Sequence(f"s{i}", None, [rng.randrange(1, 999) for _ in range(n_tok)], SamplingParams(max_tokens=9), 9)
        kind = i % 3
        # 0: an ordinary decode; 1: its last token still being sampled; 2: a one-token prefill chunk
        seq.num_computed_tokens = {0: n_tok - 1, 1: n_tok, 2: max(0, n_tok - 3)}[kind]
        seq.block_table = [rng.randrange(200) for _ in range(seq.num_computed_tokens // 8 + 1)]
        if i == 4 and len(seq.block_table) > 2:
            seq.block_table[0] = RELEASED
        seq.long_rope = i % 2 == 1
        seq.lora_slot = i % 4 - 1  # adapters' slots 0-2 and none (-1)
        scheduled.append((seq, 1))
    return scheduled


def snapshot(r: ModelRunner, result, rows_n: int):
    tokens, n_seqs, cols, sample_rows, max_q = result
    h = r.host
    return (tokens, n_seqs, cols, list(sample_rows), max_q, h.ids[:rows_n].tolist(), h.pos[:rows_n].tolist(),
            h.slots[:rows_n].tolist(), h.ctx[:rows_n].tolist(), h.qsl[: rows_n + 1].tolist(),
            h.rows[: len(sample_rows)].tolist(), h.table(rows_n, cols).copy().tolist(),
            h.lora[:rows_n].tolist() if r.lora else None)


@pytest.mark.parametrize("long_rope,lora", [(None, False), ((64, 1000), False), (None, True)])
@pytest.mark.parametrize("pad_to,table_cols", [(0, 0), (12, 0), (0, 20)])
def test_decode_fill_equals_the_row_by_row_fill(long_rope, lora, pad_to, table_cols):
    for seed in range(5):
        scheduled = decode_batch(random.Random(seed))
        rows_n = max(len(scheduled), pad_to)
        r = runner(long_rope, lora)
        fast = snapshot(r, r.fill_host(scheduled, pad_to=pad_to, table_cols=table_cols), rows_n)
        r.host.table(rows_n, fast[2])[:] = 7  # stale values: the row-by-row fill must overwrite them too
        r.host.ids[:] = r.host.pos[:] = r.host.slots[:] = r.host.lora[:] = 5
        slow = snapshot(r, r._fill_rows(scheduled, pad_to, table_cols), rows_n)
        assert fast == slow
        assert fast[0] == len(scheduled) and 2 not in [i % 3 for i in fast[3]]  # one-token chunks do not sample
        if long_rope is not None:
            assert np.any(np.array(fast[6][:len(scheduled)]) >= 1000)
        if lora:  # each row its sequence's adapter slot, padding none
            assert fast[-1] == [seq.lora_slot for seq, _ in scheduled] + [-1] * (rows_n - len(scheduled))
