"""The worker's speculative decoding: summarize jobs draft by prompt lookup unless
SUMMARIZE_SPECULATION is off (their usage and finished log line carry spec_draft_tokens and
spec_accepted_tokens; the text is the one without speculation); other jobs speculate only under
SPECULATIVE_CONFIG; the metrics carry the totals; worker-vllm's draft-model configs reach the engine
as draft_model, its older `[ngram]` spelling as ngram, other methods are noted and dropped; a bad
config fails at start naming the variable."""
import json
import logging

import pytest

from handler.engine_setup import check_engine_settings, engine_config, summarize_drafts
from handler.settings import SettingsError, load_settings
from handler.worker import Worker
from handler.worker_vllm_env import start_notes, translate
from tests import models
from tests.handler.conftest import assert_free, run, settings_for, text_of

# a meeting note written twice: a summary that copies it finds its words in the prompt
DOC = " ".join(["Meeting notes: the team discussed the budget, the roadmap and hiring plans.",
                "Action items: Alice sends the report on Friday; Bob reviews the contract."] * 3)
GREEDY = {"sampling_params": {"max_tokens": 40, "temperature": 0, "ignore_eos": True}}


@pytest.fixture(scope="module")
def loopy_llama_dir(ckpt_dir):
    """A tiny Llama of small weights: its greedy text soon repeats itself, so prompt lookup drafts
    and its drafts are accepted (the suite's usual random model rarely repeats)."""
    return models.make_checkpoint(str(ckpt_dir / "llama-loopy"), "llama", seed=9, initializer_range=0.02)


def finished_lines(caplog) -> list[dict]:
    return [r.job_finished for r in caplog.records if hasattr(r, "job_finished")]


def test_summarize_jobs_speculate_by_default_and_report_it(loop, loopy_llama_dir, caplog):
    caplog.set_level(logging.INFO, logger="handler")
    env = dict(MAX_MODEL_LEN=512, NUM_KV_BLOCKS=128)
    on, off = Worker(settings_for(loopy_llama_dir, **env)), Worker(
        settings_for(loopy_llama_dir, SUMMARIZE_SPECULATION="false", **env))
    try:
        job = {"summarize": {"text": DOC, "max_tokens": 48}, "sampling_params": {"ignore_eos": True}}
        a, b = run(loop, on, job, "sum-on"), run(loop, off, job, "sum-off")
        assert text_of(a) == text_of(b)
        usage = a["output"][-1]["usage"]
        assert 0 < usage["spec_accepted_tokens"] <= usage["spec_draft_tokens"]
        assert "spec_draft_tokens" not in b["output"][-1]["usage"]
        line = next(r for r in finished_lines(caplog) if r["completion_tokens"] == usage["completion_tokens"]
                    and "spec_draft_tokens" in r)
        assert (line["spec_draft_tokens"], line["spec_accepted_tokens"]) == (usage["spec_draft_tokens"],
                                                                             usage["spec_accepted_tokens"])
        plain = run(loop, on, {"prompt": DOC, **GREEDY}, "plain")  # not a summarize job: no speculation
        assert "spec_draft_tokens" not in plain["output"][-1]["usage"]
        summary = on.metrics.summary()
        assert summary["spec_draft_tokens"] == on.engine.stats()["spec_draft_tokens"] >= usage["spec_draft_tokens"]
        assert summary["spec_accepted_tokens"] == on.engine.stats()["spec_accepted_tokens"]
        assert 0 < summary["spec_acceptance_rate"] <= 1
        assert_free(on)
    finally:
        loop.run_until_complete(on.aclose())
        loop.run_until_complete(off.aclose())


def test_speculative_config_applies_to_every_job(loop, loopy_llama_dir):
    cfg = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1})
    w = Worker(settings_for(loopy_llama_dir, SPECULATIVE_CONFIG=cfg))
    try:
        out = run(loop, w, {"prompt": DOC, **GREEDY})
        usage = out["output"][-1]["usage"]
        assert usage["spec_accepted_tokens"] > 0 and text_of(out)
    finally:
        loop.run_until_complete(w.aclose())


def test_a_draft_model_as_worker_vllm_names_it(loop, loopy_llama_dir):
    """worker-vllm's SPECULATIVE_CONFIG with a draft model (`model`, no method): every job drafts
    with it, and the text is the one without speculation."""
    cfg = json.dumps({"model": loopy_llama_dir, "num_speculative_tokens": 3})
    on, off = Worker(settings_for(loopy_llama_dir, SPECULATIVE_CONFIG=cfg)), Worker(
        settings_for(loopy_llama_dir, SUMMARIZE_SPECULATION="false"))
    try:
        a, b = run(loop, on, {"prompt": DOC, **GREEDY}), run(loop, off, {"prompt": DOC, **GREEDY})
        usage = a["output"][-1]["usage"]
        assert usage["spec_draft_tokens"] > 0 and usage["spec_accepted_tokens"] > 0
        assert text_of(a) == text_of(b)
        assert on.engine.engine.speculator.config.method == "draft_model"
    finally:
        loop.run_until_complete(on.aclose())
        loop.run_until_complete(off.aclose())


def test_configs_as_worker_vllm_writes_them():
    env, notes = translate({"SPECULATIVE_CONFIG": '{"model": "org/draft", "num_speculative_tokens": 3}'})
    assert json.loads(env["SPECULATIVE_CONFIG"]) == {"model": "org/draft", "num_speculative_tokens": 3,
                                                     "method": "draft_model"} and not notes  # vLLM's reading
    draft = '{"method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 4}'
    assert engine_config(load_settings({"SPECULATIVE_CONFIG": draft}), "m").speculative_config == json.loads(draft)
    env, notes = translate({"SPECULATIVE_CONFIG": '{"method": "eagle", "model": "org/eagle", "num_speculative_tokens": 3}'})
    assert env["SPECULATIVE_CONFIG"] == "" and any("'eagle' is not implemented" in n for n in notes)
    env, notes = translate({"SPECULATIVE_CONFIG": '{"model": "[ngram]", "num_speculative_tokens": 3, '
                                                  '"prompt_lookup_max": 3}'})
    settings = load_settings(env)
    assert engine_config(settings, "m").speculative_config == {"num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                                               "method": "ngram"}
    assert not start_notes({"SPECULATIVE_CONFIG": "{}"}, ["SPECULATIVE_CONFIG"])
    assert engine_config(load_settings({}), "m").speculative_config["opt_in"] is True  # summarize jobs ask
    assert engine_config(load_settings({"SUMMARIZE_SPECULATION": "false"}), "m").speculative_config is None
    with pytest.raises(SettingsError, match="SPECULATIVE_CONFIG"):
        check_engine_settings(load_settings({"SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 0}'}))


def test_summarize_drafts_fit_the_cpu_int4_kernels_row_block(monkeypatch):
    """Summarize jobs draft 3 tokens a step on a CPU in bfloat16 (a verify step of 4 rows, one
    block of torch's int4 kernel), 4 in float32 and on a GPU; SPECULATIVE_CONFIG's own k stands."""
    import engine.llm_engine as le

    monkeypatch.setattr(le, "resolve_device", lambda device: "cpu")
    assert summarize_drafts("bfloat16") == 3 and summarize_drafts("float32") == 4
    bf16 = engine_config(load_settings({"DTYPE": "bfloat16"}), "m").speculative_config
    assert bf16["num_speculative_tokens"] == 3 and bf16["opt_in"] is True
    assert engine_config(load_settings({"DTYPE": "float32"}), "m").speculative_config["num_speculative_tokens"] == 4
    monkeypatch.setattr(le, "cpu_has_native_bf16", lambda: True)
    assert summarize_drafts("auto") == 3
    monkeypatch.setattr(le, "cpu_has_native_bf16", lambda: False)
    assert summarize_drafts("auto") == 4
    monkeypatch.setattr(le, "resolve_device", lambda device: "cuda")
    assert summarize_drafts("bfloat16") == 4
    own = json.dumps({"method": "ngram", "num_speculative_tokens": 5})
    assert engine_config(load_settings({"DTYPE": "bfloat16", "SPECULATIVE_CONFIG": own}), "m"
                         ).speculative_config["num_speculative_tokens"] == 5
