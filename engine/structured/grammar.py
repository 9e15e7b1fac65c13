"""StructuredOutputsParams compiled by llguidance against one model's tokenizer, once per
distinct spec (an LRU cache), and the per-sequence matchers made from them. A spec
llguidance cannot compile, or whose first tokens already pass its parser's limits (a schema of
too many live alternatives), raises InvalidInputError naming structured_outputs, before the
request is queued."""
from __future__ import annotations

import json
import threading
from collections import OrderedDict

from engine.errors import InvalidInputError
from engine.structured.params import FIELD, StructuredOutputsParams

# Whitespace allowed between JSON tokens unless the request sets its own pattern: a few blanks,
# then at most one line break and its indentation. Bounded,
# so a model cannot loop on whitespace until max_tokens (a deep, indented document fits)
JSON_WHITESPACE = r"[\x20\x09]{0,8}(\r?\n[\x20\x09]{0,48})?"
CACHE_SIZE = 256
PROBE_TOKENS = 24  # tokens of the probe walk through a new grammar (about 1 ms each on a 150k vocabulary)


def _no_additional_properties(schema):
    """A copy of a JSON schema whose objects without `additionalProperties` get false (vLLM's
    disable_additional_properties)."""
    if isinstance(schema, list):
        return [_no_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _no_additional_properties(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def grammar_text(params: StructuredOutputsParams) -> str:
    """llguidance's grammar definition of params (not yet checked against a tokenizer)."""
    import llguidance

    LLMatcher = llguidance.LLMatcher
    kind = params.kind
    if kind in ("json", "json_object"):
        schema = {"type": "object"} if kind == "json_object" else params.json
        if isinstance(schema, str):
            schema = json.loads(schema)
        if params.disable_additional_properties:
            schema = _no_additional_properties(schema)
        pattern = JSON_WHITESPACE if params.whitespace_pattern is None else params.whitespace_pattern
        if params.disable_any_whitespace or pattern == "":  # an empty pattern: no whitespace at all
            options = {"whitespace_flexible": False}
        else:
            options = {"whitespace_pattern": pattern}
        return LLMatcher.grammar_from_json_schema(schema, defaults=options)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(params.regex)
    if kind == "choice":
        return llguidance.grammar_from("choice", params.choice)
    return llguidance.grammar_from("grammar", params.grammar)  # Lark, or GBNF converted to Lark


class Grammar:
    """One compiled spec. Its matcher at the start is built once, here (0.7-1.5 ms for a JSON
    schema on a 49k vocabulary); matcher() copies it (microseconds) for each sequence."""

    def __init__(self, tokenizer, text: str, kind: str):
        import llguidance

        self.text = text
        self.kind = kind
        self._start = llguidance.LLMatcher(tokenizer, text, log_level=0)

    @property
    def error(self) -> str | None:
        return self._start.get_error() if self._start.is_error() else None

    def matcher(self):
        return self._start.deep_copy()


class GrammarCompiler:
    """One model's compiler: its tokenizer wrapped for llguidance (made on first use, it
    takes up to a second), the model's vocabulary size (ids past the tokenizer's are
    never allowed) and its EOS ids (allowed once the output is complete)."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_ids):
        self.hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._tokenizer = None
        self._cache: OrderedDict[tuple, Grammar] = OrderedDict()
        self._lock = threading.Lock()  # the input processor may run in a worker thread

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            import llguidance.hf

            try:
                self._tokenizer = llguidance.hf.from_tokenizer(self.hf_tokenizer, n_vocab=self.vocab_size,
                                                               eos_token=self.eos_token_ids or None)
            except ValueError as exc:  # a slow (Python) tokenizer
                raise InvalidInputError(f"{FIELD}: this model's tokenizer cannot be used for structured "
                                        f"output ({exc})", field=FIELD) from None
        return self._tokenizer

    def compile(self, params: StructuredOutputsParams) -> Grammar:
        key = params.key()
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
                return grammar
        grammar = self._compile(params)
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def _compile(self, params: StructuredOutputsParams) -> Grammar:
        import llguidance

        try:
            text = grammar_text(params)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise InvalidInputError(f"{FIELD}: the {params.kind} cannot be compiled: {exc}", field=FIELD) from None
        error = llguidance.LLMatcher.validate_grammar(text, self.tokenizer)
        grammar = None if error else Grammar(self.tokenizer, text, params.kind)
        error = error or grammar.error
        if error:
            raise InvalidInputError(f"{FIELD}: the {params.kind} cannot be compiled: {error.strip()}", field=FIELD)
        error = probe(grammar, self.eos_token_ids)
        if error:
            raise InvalidInputError(f"{FIELD}: the {params.kind} is too complex to enforce (its parser's limits "
                                    f"are passed within its first tokens): {error.strip()[:300]}", field=FIELD)
        return grammar


def probe(grammar: Grammar, eos_token_ids) -> str | None:
    """Walk a copy of the grammar's matcher PROBE_TOKENS tokens, each the lowest id it allows (not
    an end token while another is allowed): the parser error a generation would meet there (the
    Earley row limit of a schema with many live alternatives), or None. A schema that only passes
    the limits deeper in is still caught by the generation itself."""
    import numpy as np

    matcher = grammar.matcher()
    eos = set(eos_token_ids)
    for _ in range(PROBE_TOKENS):
        if matcher.is_stopped():
            return None
        allowed = np.flatnonzero(np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8),
                                               bitorder="little"))
        if matcher.is_error():
            return matcher.get_error()
        token = next((int(t) for t in allowed if int(t) not in eos), None)
        if token is None:
            return None
        if not matcher.consume_token(token):
            return matcher.get_error() if matcher.is_error() else None
    return None
