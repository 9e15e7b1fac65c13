"""Incremental detokenization: streaming Korean through a byte-level BPE
tokenizer never emits a broken character, and the pieces join to the text."""
import asyncio

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
        engine.engine.sampler.sample = lambda logits, seqs: [
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
