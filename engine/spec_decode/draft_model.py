"""Drafts from a small model of the same tokenizer ({"method": "draft_model", "model": path}):
its own runner and KV cache, indexed by the target's block tables (the block manager allocates
once for both, so a block holds both models' K and V of its tokens). Each step the scheduler
first sizes the drafting requests' verify runs with placeholders (engine.spec_decode.speculator),
then fill() replaces them: one forward brings the draft model's KV up to the request's last
token (the whole context the first time, and again after a preemption; else the tokens the
last verify step accepted), whose logits give the first draft, then one forward a further draft.
Drafts are the draft model's greedy tokens: a point mass, so the target's rejection sampling
(engine.spec_decode.verify, p_draft = 1) keeps the target's distribution, as for n-gram drafts."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from engine.errors import ModelLoadError
from engine.model import loader
from engine.runner import ModelRunner

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class DraftView:
    """What the runner reads of a sequence, for one draft-model forward: its tokens (with the
    drafts so far), how many have the draft model's KV, and the target's block table."""

    token_ids: list[int]
    num_computed_tokens: int
    block_table: list[int]
    spec_token_ids: list[int] = field(default_factory=list)
    long_rope: bool = False
    lora_slot: int = -1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class DraftModel:
    def __init__(self, path: str, target_spec, tokenizer, dtype, device: str, block_size: int, max_model_len: int,
                 max_num_seqs: int, budget: int, seed: int):
        t0 = time.monotonic()
        self.path = loader.resolve_model_path(path)
        spec = loader.read_model_spec(self.path)
        _check_vocabulary(self.path, tokenizer)
        self.model = loader.load_model(spec, self.path, dtype, device, max_positions=max_model_len, load_format="auto",
                                       seed=seed, name=path)
        self.vocab = min(spec.vocab_size, target_spec.vocab_size)  # drafts are ids both models know
        self.budget = budget
        self.runner = ModelRunner(self.model, block_size, dtype, device, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=budget, max_model_len=max_model_len)
        log.info("draft model %s loaded (%d layers) in %.1fs", path, spec.num_layers, time.monotonic() - t0)

    @classmethod
    def for_engine(cls, speculative, engine, budget: int) -> DraftModel | None:
        """The engine's draft model when speculative_config's method is draft_model."""
        if speculative is None or speculative.method != "draft_model":
            return None
        config = engine.config
        if engine.workers is not None:
            raise ModelLoadError("draft_model speculation does not run under tensor parallelism yet")
        windows = [engine.spec.window(i) for i in range(engine.spec.num_layers)]
        if all(windows):
            raise ModelLoadError("draft_model speculation needs the whole context in the KV cache: not with a "
                                 "model whose every layer slides (its blocks are released); use method ngram")
        return cls(speculative.model, engine.spec, engine.tokenizer, engine.dtype, engine.device, config.block_size,
                   engine.max_model_len, config.max_num_seqs, budget, config.seed)

    @torch.inference_mode()
    def fill(self, seqs: list) -> None:
        """Each sequence's spec_token_ids (placeholders, as many as the scheduler fitted) become
        the draft model's greedy continuation of its tokens."""
        views = []
        for seq in seqs:
            state = seq.spec  # engine.spec_decode.speculator.SpecState: how far its draft KV goes
            done = state.draft_kv if state.draft_kv_preemptions == seq.num_preemptions else 0  # else freed with its blocks
            views.append(DraftView(list(seq.token_ids), min(done, seq.num_tokens - 1), seq.block_table))
        want = [len(seq.spec_token_ids) for seq in seqs]
        drafts = self._catch_up(views)
        out = [[d] for d in drafts]
        for view, first in zip(views, drafts):  # the first draft joins; its KV comes with the next forward
            view.num_computed_tokens = view.num_tokens
            view.token_ids.append(first)
        for j in range(1, max(want)):
            live = [i for i, k in enumerate(want) if k > j]
            tokens = self._next([views[i] for i in live])
            for i, t in zip(live, tokens):
                views[i].num_computed_tokens = views[i].num_tokens
                views[i].token_ids.append(t)
                out[i].append(t)
        for seq, drafts_i, k in zip(seqs, out, want):
            seq.spec_token_ids = drafts_i[:k]
            # the draft KV now covers its tokens; that of drafts the target rejects is overwritten later
            seq.spec.draft_kv, seq.spec.draft_kv_preemptions = seq.num_tokens, seq.num_preemptions

    def _catch_up(self, views: list[DraftView]) -> list[int]:
        """The draft model's KV up to each view's last token, in forwards within the token budget;
        the greedy token after each."""
        first: dict[int, int] = {}
        pending = list(range(len(views)))
        while pending:
            batch, budget = [], self.budget
            for i in pending:
                if budget <= 0:
                    break
                view = views[i]
                n = min(view.num_tokens - view.num_computed_tokens, budget)
                batch.append((i, n))
                budget -= n
            logits = self.runner.execute([(views[i], n) for i, n in batch])
            row = 0
            for i, n in batch:
                view = views[i]
                view.num_computed_tokens += n
                if view.num_computed_tokens == view.num_tokens:  # its last token sampled a row
                    first[i] = int(logits[row, : self.vocab].argmax())
                    row += 1
            pending = [i for i in pending if i not in first]
        return [first[i] for i in range(len(views))]

    def _next(self, views: list[DraftView]) -> list[int]:
        """One draft-model decode step: each view's newest token in, its greedy next token out."""
        for view in views:
            view.num_computed_tokens = view.num_tokens - 1
        logits = self.runner.execute([(v, 1) for v in views])
        return logits[:, : self.vocab].argmax(-1).tolist()


def _check_vocabulary(path: str, tokenizer) -> None:
    """The draft model must speak the target's token ids: the same vocabulary, id for id."""
    from engine.tokenizer import load_tokenizer

    try:
        theirs = load_tokenizer(path, None).get_vocab()
    except Exception as exc:  # noqa: BLE001 - a folder without a tokenizer cannot be checked
        raise ModelLoadError(f"speculative_config.model {path!r}: its tokenizer could not be read ({exc})") from exc
    if theirs != tokenizer.get_vocab():
        raise ModelLoadError(f"speculative_config.model {path!r} has another vocabulary than the served model: "
                             "a draft model must share the target's tokenizer")
