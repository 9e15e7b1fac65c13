"""KV block pool: ref counts, prefix cache of full blocks (chained hashes,
token ids compared on a hit), and LRU reuse of freed blocks."""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set while the block is in the prefix cache
    parent_hash: int | None = None
    token_ids: tuple[int, ...] | None = None
    salt: str | None = None  # the cache_salt of the request that filled it
    freed_at: float = 0.0  # monotonic time its last holder let go

    def reset(self):
        self.hash = self.parent_hash = self.token_ids = self.salt = None


RELEASED = -1  # a block table entry whose block went back to the pool (no query will read it again)


def block_hash(parent: int | None, token_ids: tuple[int, ...], salt: str | None) -> int:
    return hash((parent, token_ids, salt))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 ttl_s: float | None = None, clock=time.monotonic):
        assert num_blocks > 0 and block_size > 0
        self.ttl_s, self.clock = ttl_s, clock
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # blocks with ref_count 0; the front is reused first (uncached blocks
        # are put there, freed cached blocks at the back: least recently used first)
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # hash -> block id
        self.hit_tokens = 0
        self.query_tokens = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Free blocks, counting cached ones that can be reused."""
        return len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- computed blocks (prefix hits) -------------------------------------
    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of seq; at least one token is left to compute."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[int] = []
        parent = None
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = block_hash(parent, tokens, seq.cache_salt)
            bid = self.cached.get(h)
            if bid is None:
                break
            block = self.blocks[bid]
            if block.token_ids != tokens or block.parent_hash != parent or block.salt != seq.cache_salt:
                break  # a hash collision: never reuse KV of other tokens (or of another salt)
            if self._expired(block):
                self._uncache(block)
                break
            hits.append(bid)
            parent = h
        return hits

    # -- allocate ----------------------------------------------------------
    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed: list[int] = ()) -> bool:
        return self._new_blocks_needed(seq, num_new_tokens, computed) <= self.num_free_blocks - sum(
            1 for b in computed if self.blocks[b].ref_count == 0
        )

    def _new_blocks_needed(self, seq: Sequence, num_new_tokens: int, computed) -> int:
        total = seq.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        return max(0, self.blocks_needed(total) - len(seq.block_table) - len(computed))

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed: list[int] = ()) -> bool:
        """Give seq the blocks for num_new_tokens more tokens (after its computed
        prefix blocks, when given). False, changing nothing, if they do not fit."""
        if computed:
            assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.can_allocate(seq, num_new_tokens, computed):
            return False
        for bid in computed:
            self._touch(bid)
            seq.block_table.append(bid)
        if computed:
            seq.num_computed_tokens = len(computed) * self.block_size
            seq.num_cached_prompt_tokens = seq.num_computed_tokens
            seq.block_hashes = [self.blocks[b].hash for b in computed]
        for _ in range(self._new_blocks_needed(seq, num_new_tokens, ())):
            seq.block_table.append(self._pop_free())
        return True

    def _touch(self, bid: int):
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.free[bid]
        block.ref_count += 1

    def _pop_free(self) -> int:
        bid, _ = self.free.popitem(last=False)
        block = self.blocks[bid]
        assert block.ref_count == 0
        if block.hash is not None:
            if self.cached.get(block.hash) == bid:
                del self.cached[block.hash]
            block.reset()
        block.ref_count = 1
        return bid

    def _expired(self, block: Block) -> bool:
        return self.ttl_s is not None and block.ref_count == 0 and self.clock() - block.freed_at > self.ttl_s

    def _uncache(self, block: Block):
        if self.cached.get(block.hash) == block.block_id:
            del self.cached[block.hash]
        block.reset()

    def expire(self) -> list[int]:
        """Drop every unused cached block older than the TTL from the index; returns their
        ids, whose KV the engine then zeroes (a confidential prompt does not stay in memory)."""
        old = [self.blocks[b] for b in self.cached.values() if self._expired(self.blocks[b])]
        for block in old:
            self._uncache(block)
        return [block.block_id for block in old]

    def record_query(self, num_tokens: int, num_hit_tokens: int):
        self.query_tokens += num_tokens
        self.hit_tokens += num_hit_tokens

    # -- cache full blocks ----------------------------------------------------
    def cache_full_blocks(self, seq: Sequence):
        """Enter seq's newly completed (computed and full) blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = seq.block_hashes
        for i in range(len(hashes), seq.num_computed_tokens // bs):
            parent = hashes[-1] if hashes else None
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = block_hash(parent, tokens, seq.cache_salt)
            hashes.append(h)
            if seq.block_table[i] == RELEASED:
                continue
            block = self.blocks[seq.block_table[i]]
            if h in self.cached or block.hash is not None:
                continue  # an equal block is cached already
            block.hash, block.parent_hash, block.token_ids, block.salt = h, parent, tokens, seq.cache_salt
            self.cached[h] = block.block_id

    # -- free -------------------------------------------------------------------
    def _release(self, bid: int) -> None:
        block = self.blocks[bid]
        assert block.ref_count > 0, f"double free of block {bid}"
        block.ref_count -= 1
        if block.ref_count == 0:
            block.freed_at = self.clock()
            self.free[bid] = None
            if block.hash is None:
                self.free.move_to_end(bid, last=False)

    def free_seq(self, seq: Sequence):
        for bid in reversed(seq.block_table):
            if bid != RELEASED:
                self._release(bid)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
        seq.num_released_blocks = 0

    def release_outside_window(self, seq: Sequence, window: int) -> int:
        """Give back seq's leading blocks that no query from num_computed_tokens on can
        see when every layer attends a window of `window` keys (a query at q sees keys
        > q - window): block b goes once its last token (b+1)*bs - 1 <= q - window. Its
        table entry becomes RELEASED (the attention kernels never read below a window);
        a full, cached block stays in the prefix cache. Returns the blocks released."""
        n = min(len(seq.block_table), max(0, (seq.num_computed_tokens - window + 1) // self.block_size))
        done = seq.num_released_blocks
        for i in range(done, n):
            self._release(seq.block_table[i])
            seq.block_table[i] = RELEASED
        seq.num_released_blocks = max(done, n)
        return max(0, n - done)

    def check_invariants(self, seqs) -> None:
        """Ref counts equal the block tables that hold each block; free = unreferenced."""
        counts = [0] * self.num_blocks
        for seq in seqs:
            for bid in seq.block_table:
                if bid != RELEASED:
                    counts[bid] += 1
        for block, n in zip(self.blocks, counts):
            assert block.ref_count == n, f"block {block.block_id}: ref {block.ref_count}, held {n}"
            assert (block.block_id in self.free) == (n == 0), f"block {block.block_id} free-list mismatch"
        for h, bid in self.cached.items():
            assert self.blocks[bid].hash == h
