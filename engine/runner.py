"""Runs the model for one scheduled step: KV cache allocation, packed inputs
and attention metadata, forward, logits of the positions that sample.

Inputs are built on the host in numpy and reach the device by asynchronous
copies from pinned buffers, so preparing a step never waits for the GPU.
Decode steps replay CUDA graphs (engine.cuda_graph), and so do other steps of up to
max_cudagraph_tokens tokens (engine.mixed_graphs), unless enforce_eager."""
from __future__ import annotations

import itertools
import logging

import numpy as np
import torch

import llm_kernels
from llm_kernels import tune_cache
from engine.model.layers import ForwardContext, PagedAttention, forward_context
from engine.sequence import Sequence

log = logging.getLogger(__name__)


class HostBuffers:
    """Reused host arrays of one step's inputs (pinned on CUDA). Before they are
    refilled, the copies out of them from the previous step must be done."""

    def __init__(self, max_tokens: int, max_seqs: int, pin: bool):
        def buf(n, dtype):
            t = torch.empty(n, dtype=dtype, pin_memory=pin)
            return t, t.numpy()

        self.pin = pin
        self.ids_t, self.ids = buf(max_tokens, torch.int64)
        self.pos_t, self.pos = buf(max_tokens, torch.int64)
        self.slots_t, self.slots = buf(max_tokens, torch.int64)
        self.ctx_t, self.ctx = buf(max_seqs + 1, torch.int32)  # + 1: a mixed-step graph's padding sequence
        self.qsl_t, self.qsl = buf(max_seqs + 2, torch.int32)
        self.rows_t, self.rows = buf(max_tokens, torch.int64)  # a verify step samples several rows a request
        self.lora_t, self.lora = buf(max_tokens, torch.int32)  # each token's adapter slot (engine.lora)
        self.table_t = torch.empty(0, dtype=torch.int32)
        self.copied: torch.cuda.Event | None = None

    def table(self, rows: int, cols: int) -> np.ndarray:
        if self.table_t.numel() < rows * cols:
            self.table_t = torch.empty(max(rows * cols, 2 * self.table_t.numel()), dtype=torch.int32,
                                       pin_memory=self.pin)
        return self.table_t[: rows * cols].numpy().reshape(rows, cols)

    def wait(self):
        if self.copied is not None:
            self.copied.synchronize()  # normally long done: the previous step ended with a sync
            self.copied = None


def rope_row(long_rope: tuple[int, int], seq: Sequence, pos):
    """The rope cache row of a token at `pos` (an int or an array) for a two-sided
    (longrope) cache, long_rope = (switch length, row offset): the long rows for every
    token of a sequence once it is longer than the switch (seq.long_rope, set by the
    engine and the scheduler, which recomputes a sequence's KV when it crosses)."""
    return pos + long_rope[1] if seq.long_rope else pos


class ModelRunner:
    def __init__(self, model, block_size: int, dtype, device, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, max_model_len: int | None = None, kv_cache_dtype=None):
        self.model = model
        self.block_size = block_size
        self.dtype = dtype
        self.kv_cache_dtype = kv_cache_dtype or dtype  # FP8: llm_kernels/kv_cache.py's scaled storage
        self.device = torch.device(device)
        self.attn_layers = [m for m in model.modules() if isinstance(m, PagedAttention)]
        self.kv_cache: torch.Tensor | None = None  # every layer's K and V (allocate_kv_cache)
        self.k_caches: list[torch.Tensor] = []
        self.v_caches: list[torch.Tensor] = []
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len or model.spec.max_position_embeddings
        self.max_blocks_per_seq = -(-self.max_model_len // block_size)
        cuda = self.device.type == "cuda"
        self.host = HostBuffers(max(max_num_batched_tokens, max_num_seqs), max_num_seqs, pin=cuda)
        self.lora = False  # adapters enabled (engine.lora): steps carry each token's slot
        self.graphs = None  # engine.cuda_graph.DecodeGraphs once captured (capture_graphs)
        self.mixed = None  # engine.mixed_graphs.MixedGraphs once captured
        if cuda:  # the kernels' tuned configs from earlier processes, and ours kept for later ones
            tune_cache.activate(tune_cache.default_dir(), self.device)

    def capture_graphs(self, max_batch: int, max_mixed_tokens: int = 0) -> None:
        """CUDA graphs of decode steps of 1..max_batch sequences and, when max_mixed_tokens,
        of other steps of up to that many tokens (after the KV cache is allocated). Mixed
        graphs that cannot be captured (out of memory) are left out: those steps run eagerly."""
        try:
            self._capture(max_batch, max_mixed_tokens)
        finally:
            tune_cache.save()  # what the warm-ups before the captures tuned, for later processes

    def _capture(self, max_batch: int, max_mixed_tokens: int) -> None:
        from engine.cuda_graph import DecodeGraphs
        from engine.mixed_graphs import MixedGraphs

        self.graphs = DecodeGraphs(self.model, self.device, max_batch, self.max_blocks_per_seq, lora=self.lora)
        self.graphs.capture()
        if max_mixed_tokens:
            mixed = MixedGraphs(self.model, self.device, max_mixed_tokens, self.max_num_seqs, self.max_blocks_per_seq,
                                lora=self.lora)
            try:
                mixed.capture(self.graphs.pool)
            except torch.OutOfMemoryError:
                log.warning("no memory for the mixed-step CUDA graphs: prefill and mixed steps run eagerly")
                torch.cuda.empty_cache()
                return
            self.mixed = mixed

    def allocate_kv_cache(self, num_blocks: int):
        """One tensor [layers, 2, num_blocks, block_size, kv_heads, head_dim]; each layer's K
        and V caches are views of it (so blocks are scrubbed across all layers at once)."""
        s = self.model.spec
        shape = (num_blocks, self.block_size, s.num_kv_heads, s.head_dim)
        self.free_kv_cache()
        self.kv_cache = torch.zeros((len(self.attn_layers), 2, *shape), dtype=self.kv_cache_dtype,
                                    device=self.device)
        fp8 = self.kv_cache_dtype in llm_kernels.FP8_DTYPES
        for i, layer in enumerate(self.attn_layers):
            layer.k_cache, layer.v_cache = self.kv_cache[i, 0], self.kv_cache[i, 1]
            layer.use_cache_scales(fp8)
            self.k_caches.append(layer.k_cache)
            self.v_caches.append(layer.v_cache)

    def free_kv_cache(self):
        for layer in self.attn_layers:
            layer.k_cache = layer.v_cache = None
        self.k_caches, self.v_caches = [], []
        self.kv_cache = None

    def scrub_kv(self, block_ids: list[int]) -> None:
        """Zero the K and V of these blocks in every layer: one index_fill over the whole
        cache (a single kernel launch on the GPU, no host synchronisation)."""
        if block_ids and self.kv_cache is not None:
            ids = torch.tensor(block_ids, dtype=torch.long)
            cache = self.kv_cache
            if cache.dtype in llm_kernels.FP8_DTYPES:  # index_fill_ has no FP8 kernel: zero the bytes
                cache = cache.view(torch.uint8)
            cache.index_fill_(2, ids.to(self.device, non_blocking=True), 0)

    # -- inputs -------------------------------------------------------------------
    def fill_host(self, scheduled: list[tuple[Sequence, int]], pad_to: int = 0, table_cols: int = 0):
        """Writes the step's inputs into the host buffers. Returns (tokens, seqs,
        table columns, sample rows, max query length). Rows past len(scheduled)
        up to pad_to are padding: slot -1 (no KV write), context length 0."""
        if all(n == 1 for _, n in scheduled):
            return self._fill_decode(scheduled, pad_to, table_cols)
        return self._fill_rows(scheduled, pad_to, table_cols)

    def _fill_rows(self, scheduled: list[tuple[Sequence, int]], pad_to: int, table_cols: int):
        """fill_host row by row (any chunk sizes)."""
        h, bs = self.host, self.block_size
        long_rope = getattr(self.model, "long_rope", None)
        h.wait()
        n_seqs = len(scheduled)
        rows_n = max(n_seqs, pad_to)
        cols = max(table_cols, max(len(seq.block_table) for seq, _ in scheduled))
        table = h.table(rows_n, cols)
        t = 0
        sample_rows = []
        max_q = 0
        h.qsl[0] = 0
        for i, (seq, n) in enumerate(scheduled):
            start = seq.num_computed_tokens
            bt = seq.block_table
            if n == 1:  # a token still being sampled (asynchronous scheduling) comes from the device
                h.ids[t] = seq.token_ids[start] if start < len(seq.token_ids) else 0
                h.pos[t] = start if long_rope is None else rope_row(long_rope, seq, start)
                h.slots[t] = bt[start // bs] * bs + start % bs
            else:  # a chunk, or a verify step's last token and drafts (engine.spec_decode)
                pos = np.arange(start, start + n)
                known = seq.token_ids[start : start + n]
                h.ids[t : t + n] = known if len(known) == n else known + seq.spec_token_ids[: n - len(known)]
                h.pos[t : t + n] = pos if long_rope is None else rope_row(long_rope, seq, pos)
                h.slots[t : t + n] = np.asarray(bt, dtype=np.int64)[pos // bs] * bs + pos % bs
            if self.lora:
                h.lora[t : t + n] = seq.lora_slot
            t += n
            max_q = max(max_q, n)
            h.qsl[i + 1] = t
            h.ctx[i] = start + n
            table[i, : len(bt)] = bt
            table[i, len(bt) :] = 0
            # the positions from its last token on sample: one, or a verify step's k + 1; past the
            # last token: the token is still being sampled (engine.async_scheduling)
            if start + n >= seq.num_tokens:
                sample_rows.extend(range(t - (start + n - max(start, seq.num_tokens - 1)), t))
        if rows_n > n_seqs:  # graph padding
            h.ids[t : t + rows_n - n_seqs] = 0
            h.pos[t : t + rows_n - n_seqs] = 0
            h.slots[t : t + rows_n - n_seqs] = -1
            h.lora[t : t + rows_n - n_seqs] = -1
            h.ctx[n_seqs:rows_n] = 0
            h.qsl[n_seqs + 1 : rows_n + 1] = np.arange(t + 1, t + 1 + rows_n - n_seqs)
            table[n_seqs:rows_n] = 0
        h.rows[: len(sample_rows)] = sample_rows
        return t, n_seqs, cols, sample_rows, max_q

    def _fill_decode(self, scheduled: list[tuple[Sequence, int]], pad_to: int, table_cols: int):
        """fill_host for a decode step (one token a sequence), in a few array operations
        instead of a few per row: the host's share of a step at a batch of 50."""
        h, bs = self.host, self.block_size
        h.wait()
        n = len(scheduled)
        rows_n = max(n, pad_to)
        seqs = [seq for seq, _ in scheduled]
        bts = [seq.block_table for seq in seqs]
        lens = np.fromiter(map(len, bts), dtype=np.int64, count=n)
        cols = max(table_cols, int(lens.max()))
        start = np.fromiter((seq.num_computed_tokens for seq in seqs), dtype=np.int64, count=n)
        # a token still being sampled (asynchronous scheduling) comes from the device: 0 here
        h.ids[:n] = [seq.token_ids[s] if s < len(seq.token_ids) else 0 for seq, s in zip(seqs, start.tolist())]
        long_rope = getattr(self.model, "long_rope", None)
        h.pos[:n] = start
        if long_rope is not None:
            h.pos[:n] += long_rope[1] * np.fromiter((seq.long_rope for seq in seqs), dtype=np.int64, count=n)
        table = h.table(rows_n, cols)
        table[:] = 0
        table[:n][np.arange(cols) < lens[:, None]] = np.fromiter(itertools.chain.from_iterable(bts), dtype=np.int32,
                                                                 count=int(lens.sum()))
        h.slots[:n] = table[np.arange(n), start // bs].astype(np.int64) * bs + start % bs
        h.ctx[:n] = start + 1
        h.qsl[: rows_n + 1] = np.arange(rows_n + 1)
        h.ids[n:rows_n] = 0  # graph padding: slot -1 (no KV write), context length 0
        h.pos[n:rows_n] = 0
        h.slots[n:rows_n] = -1
        h.ctx[n:rows_n] = 0
        if self.lora:
            h.lora[:n] = [seq.lora_slot for seq in seqs]
            h.lora[n:rows_n] = -1
        # a decode row samples unless it is a one-token chunk short of its prompt's end
        sample_rows = [i for i, (seq, s) in enumerate(zip(seqs, start.tolist())) if s + 1 >= len(seq.token_ids)]
        h.rows[: len(sample_rows)] = sample_rows
        return n, n, cols, sample_rows, 1

    def uses_adapters(self, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Some sequence of the step uses an adapter: its forward runs the LoRA kernels (a
        step of base model requests only skips them, eager or from a graph without them)."""
        return self.lora and any(seq.lora_slot >= 0 for seq, _ in scheduled)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return t.clone()
        return t.to(self.device, non_blocking=True)

    def prepare(self, scheduled: list[tuple[Sequence, int]], adapters: bool):
        """An eager step's device inputs; adapters: its forward runs the LoRA kernels (uses_adapters)."""
        # an eager decode step on CUDA passes the table at its full width, as the
        # graphs do: the attention kernel's splits and tuned config follow the
        # width, so eager and graph steps then compute the same way
        full = self.device.type == "cuda" and all(n == 1 for _, n in scheduled)
        tokens, n_seqs, cols, rows, max_q = self.fill_host(scheduled, table_cols=self.max_blocks_per_seq if full else 0)
        h = self.host
        ctx = ForwardContext(
            slot_mapping=self._to_device(h.slots_t[:tokens]),
            block_tables=self._to_device(h.table_t[: n_seqs * cols].view(n_seqs, cols)),
            context_lens=self._to_device(h.ctx_t[:n_seqs]),
            query_start_loc=self._to_device(h.qsl_t[: n_seqs + 1]),
            is_decode=max_q == 1,
            lora_slots=self._to_device(h.lora_t[:tokens]) if adapters else None,
        )
        ids = self._to_device(h.ids_t[:tokens])
        pos = self._to_device(h.pos_t[:tokens])
        rows_t = self._to_device(h.rows_t[: len(rows)])
        self.mark_copied()
        return ids, pos, ctx, rows_t

    def mark_copied(self):
        if self.device.type == "cuda":
            self.host.copied = torch.cuda.Event()
            self.host.copied.record()

    # -- running -------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]], prompt_rows=(),
                input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [S, vocab] for the scheduled requests' sampling positions, in order (one a request, k + 1 for
        one verifying k drafts; float32, or the model's
        dtype from a decode graph, valid until the next step); then
        the rows of `prompt_rows` (prompt_logprobs): (scheduled index, offset in its chunk, count).
        input_ids: a decode step's token ids on the device (the previous step's samples, not
        yet on the host), in place of the sequences' own."""
        adapters = self.uses_adapters(scheduled)
        if self.graphs is not None and not prompt_rows and self.graphs.can_run(scheduled):
            bs = self.graphs.padded_size(len(scheduled))
            _, _, cols, _, _ = self.fill_host(scheduled, pad_to=bs)
            self.graphs.copy_inputs(self.host, bs, cols, adapters)
            if input_ids is not None:  # queued after the copies and the sampling that made them
                self.graphs.ids[: len(scheduled)].copy_(input_ids)
            self.mark_copied()
            return self.graphs.replay(bs, adapters)[: len(scheduled)]  # the model's dtype; valid until the next step
        tokens = sum(n for _, n in scheduled)
        if self.mixed is not None and input_ids is None and self.mixed.can_run(tokens, len(scheduled)):
            _, n_seqs, cols, rows, _ = self.fill_host(scheduled)
            tb = self.mixed.padded_tokens(tokens)
            self.mixed.copy_inputs(self.host, tokens, tb, n_seqs, cols, adapters)
            rows_t = self._to_device(self.host.rows_t[: len(rows)])
            self.mark_copied()
            return self._logits(self.mixed.replay(tb, adapters), rows_t, scheduled, prompt_rows)
        ids, pos, ctx, rows_t = self.prepare(scheduled, adapters)
        if input_ids is not None:
            assert ctx.is_decode and len(input_ids) == len(scheduled)
            ids = input_ids
        with forward_context(ctx):
            hidden = self.model(ids, pos)
        return self._logits(hidden, rows_t, scheduled, prompt_rows)

    def _logits(self, hidden: torch.Tensor, rows_t: torch.Tensor, scheduled, prompt_rows) -> torch.Tensor:
        """Float32 logits of the sampling rows of a step's hidden states, then its prompt_rows."""
        if prompt_rows:
            starts = np.cumsum([0] + [n for _, n in scheduled])
            extra = [int(starts[i]) + off + j for i, off, count in prompt_rows for j in range(count)]
            rows_t = torch.cat([rows_t, self._to_device(torch.tensor(extra, dtype=torch.int64))])
        if rows_t.numel() == 0:
            return torch.empty(0, self.model.spec.vocab_size, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, rows_t)).float()

    @torch.inference_mode()
    def profile_peak_bytes(self, num_tokens: int, num_seqs: int) -> int:
        """Peak memory (bytes above what is allocated now) of a forward over
        num_tokens prompt tokens in num_seqs sequences, all sampling, with a
        temporary KV cache for them: the activation reserve of a full step."""
        num_seqs = max(1, min(num_seqs, num_tokens))
        lens = [num_tokens // num_seqs + (1 if i < num_tokens % num_seqs else 0) for i in range(num_seqs)]
        seqs, block = [], 0
        from engine.sampling_params import SamplingParams

        for i, n in enumerate(lens):
            seq = Sequence(f"profile-{i}", None, [1] * n, SamplingParams(max_tokens=1), 1)
            seq.lora_slot = 0 if self.lora else -1  # with adapters: their kernels' memory is counted too
            nb = -(-n // self.block_size)
            seq.block_table = list(range(block, block + nb))
            block += nb
            seqs.append((seq, n))
        torch.cuda.synchronize(self.device)
        self.allocate_kv_cache(block)
        # a first forward compiles and tunes the step's kernels: what the tuner allocates to
        # time its candidates (outputs, workspaces, their graphs' pools) is not the step's peak
        self.execute(seqs)
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        logits = self.execute(seqs)
        # the sampler's working copies of the logits (float copy, edited copy, log-softmax)
        extra = 3 * logits.numel() * 4
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del logits
        self.free_kv_cache()
        torch.cuda.empty_cache()
        return peak + extra
