"""Faults injected at random engine steps (EngineConfig.fault_injection): out-of-memory in a
step, NaN/inf logits and a detokenizer exception for one request each, a dead device, an
I/O error while the weights load. Each fails only its own request with its own code; every
other request produces exactly the tokens and text of a fault-free run (greedy)."""
from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest

from engine import AsyncLLMEngine, EngineConfig, LLMEngine, SamplingParams
from engine.errors import EngineDeadError, InvalidInputError, ModelLoadError
from engine.faults import FaultInjector
from tests.hardening.conftest import size
from tests.models import TOKENIZER_TEXT

# request id -> (prompt, max_tokens): short and long prompts (the long ones prefill in chunks)
REQUESTS = {
    f"r{i}": (" ".join(TOKENIZER_TEXT[j % len(TOKENIZER_TEXT)] for j in range(i, i + 1 + i % 4)), 10 + 3 * i)
    for i in range(8)
}
SEEDS = list(range(size(4, 25)))


def make_engine(model_dir: str, faults: dict | None = None) -> LLMEngine:
    # faults are injected at step numbers and turn asynchronous scheduling off, so the
    # fault-free baseline runs without it too: both number their steps alike
    return LLMEngine(EngineConfig(model=model_dir, max_model_len=256, num_kv_blocks=128, block_size=16,
                                  max_num_batched_tokens=48, fault_injection=faults, async_scheduling=False))


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def run(engine: LLMEngine, requests: dict = REQUESTS):
    """Every request to its end: (final output by id, the steps in which each one sampled)."""
    for rid, (prompt, max_tokens) in requests.items():
        engine.add_request(rid, prompt, params(max_tokens))
    final, steps = {}, defaultdict(list)
    while engine.has_unfinished_requests():
        for out in engine.step():
            steps[out.request_id].append(engine.step_count)
            if out.finished:
                final[out.request_id] = out
    assert set(final) == set(requests)
    return final, dict(steps)


def assert_idle(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], stats
    assert stats["num_running"] == stats["num_waiting"] == 0 and not engine.requests, stats


@pytest.fixture(scope="module")
def baseline(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    final, steps = run(engine)
    assert all(out.error is None and out.outputs[0].finish_reason == "length" for out in final.values())
    assert max(len(s) for s in steps.values()) > 20  # long enough for faults in the middle
    return final, steps


@pytest.mark.parametrize("seed", SEEDS)
def test_request_faults_at_random_steps_fail_only_their_request(seed, tiny_llama_dir, baseline, figures):
    base, base_steps = baseline
    rng = random.Random(seed)
    oom_t, nan_t, detok_t = rng.sample(sorted(REQUESTS), 3)
    at = {rid: rng.choice(base_steps[rid]) for rid in (oom_t, nan_t, detok_t)}
    faults = {"oom_at_step": at[oom_t], "oom_request_id": oom_t,
              "nan_at_step": at[nan_t], "nan_request_id": nan_t, "nan_value": rng.choice(["nan", "inf", "-inf"]),
              "detokenize_error_at_step": at[detok_t], "detokenize_error_request_id": detok_t}
    engine = make_engine(tiny_llama_dir, faults)
    final, _ = run(engine)

    # (target, code, retryable, tokens it holds when it fails: the detokenizer fails after the token came)
    for rid, code, retryable, extra in ((oom_t, "out_of_memory", True, 0), (nan_t, "non_finite_logits", False, 0),
                                        (detok_t, "internal_error", False, 1)):
        out, want = final[rid], base[rid].outputs[0]
        err = out.error
        assert err is not None and err.code == code and err.retryable is retryable, (rid, faults, err)
        kept = base_steps[rid].index(at[rid]) + extra
        assert out.outputs[0].token_ids == want.token_ids[:kept], (rid, faults)
        assert want.text.startswith(err.details["partial_text"]), (rid, faults)
        assert out.outputs[0].finish_reason is None
    assert "NaN or infinite" in final[nan_t].error.message
    assert "detokenizer" in final[detok_t].error.message
    for rid in set(REQUESTS) - {oom_t, nan_t, detok_t}:
        got, want = final[rid].outputs[0], base[rid].outputs[0]
        assert final[rid].error is None, (rid, faults, final[rid].error)
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason), rid
    assert_idle(engine)
    # the engine goes on serving: the same prompt again gives the same text
    again, _ = run(engine, {"again": REQUESTS[oom_t]})
    assert again["again"].outputs[0].token_ids == base[oom_t].outputs[0].token_ids
    assert_idle(engine)
    figures.add("faults_engine", "request_fault_runs_passed")


async def _collect(engine: AsyncLLMEngine, rid: str, prompt: str, max_tokens: int):
    last = None
    async for out in engine.generate(prompt, params(max_tokens), request_id=rid):
        last = out
    return last


@pytest.mark.parametrize("seed", SEEDS)
def test_a_dead_device_at_a_random_step_fails_every_unfinished_request_with_engine_dead(seed, tiny_llama_dir,
                                                                                         baseline, figures):
    base, base_steps = baseline
    last_step = max(s for steps in base_steps.values() for s in steps)
    dead_at = random.Random(seed).randint(1, last_step - 1)

    async def main():
        engine = AsyncLLMEngine(make_engine(tiny_llama_dir, {"dead_at_step": dead_at}))
        results = await asyncio.gather(*(_collect(engine, rid, p, n) for rid, (p, n) in REQUESTS.items()),
                                       return_exceptions=True)
        with pytest.raises(EngineDeadError):
            await _collect(engine, "late", "after the device died", 4)
        dead = engine.is_dead
        await engine.shutdown()
        return dict(zip(REQUESTS, results)), dead

    results, dead = asyncio.run(main())
    assert dead
    failed = {rid for rid, r in results.items() if isinstance(r, BaseException)}
    assert failed, f"dead_at_step {dead_at} fired for no request"
    for rid, r in results.items():
        if rid in failed:
            assert isinstance(r, EngineDeadError) and r.code == "engine_dead" and r.retryable, (rid, r)
            assert "illegal memory access" in r.message
        else:  # finished before the device died: exactly the fault-free text
            got, want = r.outputs[0], base[rid].outputs[0]
            assert (got.token_ids, got.text) == (want.token_ids, want.text), rid
    figures.add("faults_engine", "dead_device_runs_passed")


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_an_io_error_while_the_weights_load_is_model_load_failed(seed, tiny_llama_dir):
    from engine.model import loader

    tensors = sum(1 for _ in loader.iter_weights(loader.safetensors_files(tiny_llama_dir), "cpu"))
    after = random.Random(seed).randint(0, tensors)
    with pytest.raises(ModelLoadError) as info:
        make_engine(tiny_llama_dir, {"load_error_after_tensors": after})
    err = info.value
    assert err.code == "model_load_failed" and not err.retryable
    assert "could not be loaded" in err.message and f"after {after} tensors" in err.message
    assert "Input/output error" in err.message


@pytest.mark.parametrize("spec", [
    [1], "oom", {"oom_at_step": 0, "oom_request_id": "a"}, {"oom_at_step": 1.5}, {"oom_at_step": True},
    {"oom_request_id": "a"}, {"nan_at_step": 2, "nan_request_id": ""}, {"nan_at_step": 2, "nan_value": "zero"},
    {"dead_at_step": -1}, {"load_error_after_tensors": -1}, {"oom_at_step": 2, "oom_reqest_id": "typo"},
])
def test_fault_injection_is_validated(spec):
    with pytest.raises(InvalidInputError) as info:
        EngineConfig(model="m", fault_injection=spec)
    assert info.value.field == "fault_injection"


def test_fault_injection_is_off_by_default_and_a_setting_names_its_variable():
    from handler.engine_setup import check_engine_settings
    from handler.settings import SettingsError, load_settings

    assert EngineConfig(model="m").fault_injection is None
    off = FaultInjector(None)
    sentinel = object()
    assert off.poison_logits(1, [], sentinel) is sentinel and list(off.wrap_weights(iter("ab"))) == ["a", "b"]
    with pytest.raises(SettingsError) as info:
        check_engine_settings(load_settings({"FAULT_INJECTION": '{"oom_at_step": "3"}'}))
    assert info.value.name == "FAULT_INJECTION"
