"""Incremental detokenization: streaming Korean through a byte-level BPE
tokenizer never emits a broken character, and the pieces join to the text."""
import asyncio

import pytest

from engine import AsyncLLMEngine, EngineConfig, SamplingParams
from engine.detokenizer import IncrementalDetokenizer
from tests import models

KOREAN = "회의록: 오늘 회의에서 예산과 일정을 논의했습니다. 다음 주 금요일까지 보고서를 제출합니다! 東京"


def test_korean_stream_has_no_broken_characters():
    tok = models.make_tokenizer()
    ids = tok.encode(KOREAN)
    assert len(ids) > len(KOREAN) / 2, "tokenizer should split characters into byte pieces"
    # some single tokens are not whole characters: decoding them alone breaks
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    prompt = tok.encode("prompt:")
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = [detok.add(i) for i in ids]
    pieces.append(detok.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == KOREAN == detok.text


def test_engine_streams_korean_without_broken_characters(tiny_llama_dir):
    """Through the async engine, with the sampler forced to produce KOREAN's
    tokens: every delta is whole characters and the deltas join to KOREAN."""
    from engine.sampler import SampleResult

    async def run():
        engine = AsyncLLMEngine.from_config(EngineConfig(model=tiny_llama_dir, num_kv_blocks=128))
        target = engine.tokenizer.encode(KOREAN)
        engine.engine.ahead = None  # the scripted samples reach the host only: every step synchronous
        engine.engine.sampler.sample = lambda logits, seqs, *a, **k: [
            SampleResult(target[s.num_output_tokens], 0.0, None) for s in seqs
        ]
        deltas, final = [], None
        params = SamplingParams(max_tokens=len(target), temperature=0)
        async for out in engine.generate("prompt:", params, request_id="k"):
            deltas.append(out.outputs[0].delta_text)
            final = out
        await engine.shutdown()
        return deltas, final, target

    deltas, final, target = asyncio.run(run())
    assert final.finished and final.outputs[0].token_ids == target
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == final.outputs[0].text == KOREAN
    assert len(deltas) > 5  # it really streamed


EMOJI = "회의 끝! 👍🏽 다음 단계 🎉✨ 감사합니다 👨\u200d👩\u200d👧 ok"
CUT_LIMITS = range(1, 65)


def _forced_engine_output(tiny_llama_dir, text: str, stream: bool):
    """Generate `text`'s tokens (the sampler forced to them) with every max_tokens in CUT_LIMITS
    at once, through LLM.generate or streamed through the async engine;
    {max_tokens: (final text, the streamed deltas, the final output)} and the target ids."""
    from engine import LLM
    from engine.sampler import SampleResult

    def force(engine, target):
        engine.ahead = None  # the scripted samples reach the host only: every step synchronous
        engine.sampler.sample = lambda logits, seqs, *a, **k: [
            SampleResult(target[s.num_output_tokens], 0.0, None) for s in seqs
        ]

    params = {k: SamplingParams(max_tokens=k, temperature=0, ignore_eos=True) for k in CUT_LIMITS}
    if not stream:
        llm = LLM(tiny_llama_dir, num_kv_blocks=512)
        target = llm.engine.tokenizer.encode(text)
        force(llm.engine, target)
        outs = llm.generate(["prompt:"] * len(params), list(params.values()))
        return {k: (o.outputs[0].text, [], o) for k, o in zip(params, outs)}, target

    async def run():
        engine = AsyncLLMEngine.from_config(EngineConfig(model=tiny_llama_dir, num_kv_blocks=512))
        target = engine.tokenizer.encode(text)
        force(engine.engine, target)

        async def one(limit):
            deltas, final = [], None
            async for out in engine.generate("prompt:", params[limit], request_id=f"cut{limit}"):
                deltas.append(out.outputs[0].delta_text)
                final = out
            return limit, ("".join(deltas), deltas, final)

        results = dict(await asyncio.gather(*(one(k) for k in CUT_LIMITS)))
        await engine.shutdown()
        return results, target

    return asyncio.run(run())


def _whole_characters(tok, ids, text):
    """The longest prefix of `text` that the bytes of `ids` spell in full (independent of the
    detokenizer: prefix matching against a plain decode, whose broken tail is U+FFFD)."""
    decoded = tok.decode(ids)
    n = 0
    while n < min(len(decoded), len(text)) and decoded[n] == text[n]:
        n += 1
    return text[:n]


@pytest.mark.parametrize("stream", [False, True], ids=["final", "streamed"])
@pytest.mark.parametrize("text", [KOREAN, EMOJI], ids=["korean", "emoji"])
def test_cut_at_any_max_tokens_never_ends_in_a_broken_character(tiny_llama_dir, text, stream):
    """Generation stopped at max_tokens inside a multi-byte character: the text holds the
    whole characters before it and never a U+FFFD, at every max_tokens 1..64."""
    results, target = _forced_engine_output(tiny_llama_dir, (text + " ") * 3, stream)
    tok = models.make_tokenizer()
    mid_character = [k for k in CUT_LIMITS if tok.decode(target[:k]).endswith("\ufffd")]
    assert len(mid_character) > 5, "the text should be cut inside characters at many limits"
    for k in CUT_LIMITS:
        final_text, deltas, final = results[k]
        assert final.finished and final.outputs[0].finish_reason == "length"
        assert len(final.outputs[0].token_ids) == k
        assert "\ufffd" not in final_text, (k, final_text)
        assert all("\ufffd" not in d for d in deltas)
        assert final_text == _whole_characters(tok, target[:k], (text + " ") * 3), k
