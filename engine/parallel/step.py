"""A scheduled step as rank 0 sends it to the other ranks: per request only what
they lack (token ids they have not seen, block-table changes), and the mirrors
the other ranks keep of the requests, which their ModelRunner reads as it reads
a Sequence (request_id, token_ids, num_computed_tokens, block_table, num_tokens)."""
from __future__ import annotations

from engine.sequence import Sequence, SequenceStatus

# one scheduled request: (request id, fresh, num_computed_tokens, new tokens this step,
#   token ids past those sent, block-table entries kept, block-table entries after them)
StepItem = tuple[str, bool, int, int, list[int], int, list[int]]


class StepEncoder:
    """Rank 0: remembers, per live request, how many token ids and block-table
    entries the other ranks hold, and encodes a step as the difference.

    O(1) per request and step besides the new entries: token ids only grow, and
    a block table only grows while its request runs (the block manager gives a
    preempted request a new table when it frees the old one); a table that is
    another list, or a request preempted since, is sent whole."""

    def __init__(self):
        self.sent: dict[str, tuple[Sequence, int, list[int], int, int]] = {}

    def encode(self, scheduled: list[tuple[Sequence, int]]) -> tuple[list[StepItem], list[str]]:
        """(items in scheduled order, ids of finished requests the mirrors can drop)."""
        items = []
        for seq, n in scheduled:
            prev = self.sent.get(seq.request_id)
            fresh = prev is None or prev[0] is not seq  # new, or a new request reusing an id
            table = seq.block_table
            ntok, keep = 0, 0
            if not fresh:
                _, ntok, sent_table, nblocks, preemptions = prev
                if sent_table is table and preemptions == seq.num_preemptions and nblocks <= len(table):
                    keep = nblocks
            items.append((seq.request_id, fresh, seq.num_computed_tokens, n, seq.token_ids[ntok:], keep, table[keep:]))
            self.sent[seq.request_id] = (seq, len(seq.token_ids), table, len(table), seq.num_preemptions)
        gone = [rid for rid, (seq, *_) in self.sent.items() if seq.status is SequenceStatus.FINISHED]
        for rid in gone:
            del self.sent[rid]
        return items, gone


class MirrorSeq:
    __slots__ = ("request_id", "token_ids", "num_computed_tokens", "block_table")

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.block_table: list[int] = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class StepDecoder:
    """Ranks 1..: the mirrors of rank 0's requests, brought up to date by each step."""

    def __init__(self):
        self.seqs: dict[str, MirrorSeq] = {}

    def decode(self, items: list[StepItem], gone: list[str]) -> list[tuple[MirrorSeq, int]]:
        for rid in gone:
            self.seqs.pop(rid, None)
        scheduled = []
        for rid, fresh, computed, n, tokens, keep, table in items:
            seq = self.seqs.get(rid)
            if fresh or seq is None:
                assert fresh, f"request {rid} is not mirrored"
                seq = self.seqs[rid] = MirrorSeq(rid)
            seq.token_ids.extend(tokens)
            del seq.block_table[keep:]
            seq.block_table.extend(table)
            seq.num_computed_tokens = computed
            assert computed + n <= seq.num_tokens, (rid, computed, n, seq.num_tokens)
            scheduled.append((seq, n))
        return scheduled
