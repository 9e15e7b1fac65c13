"""Jobs pick a LoRA adapter of LORA_MODULES by name: an OpenAI request's `model` (chat,
completions, responses; worker-vllm's route form too), a native job's `lora` or top-level
`model`. The output is the engine's with that adapter's LoRARequest, not the base model's;
/v1/models lists the adapters; an unknown name fails invalid_input naming the field; the
engine's refusal of an adapter mid-run is invalid_input naming the job's field; the job's log
line and the metrics name the adapter."""
import json
import logging
import shutil

import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from tests.handler.conftest import error_of, run, settings_for, text_of

GREEDY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
CHAT = [{"role": "user", "content": "Meeting notes: the team discussed the budget"}]
PROMPT = "The quick brown fox"


def completion(loop, worker, model, **extra) -> Completion:
    r = run(loop, worker, {"openai_route": "/v1/completions",
                           "openai_input": {"model": model, "prompt": PROMPT, **GREEDY, **extra}})
    assert r["status"] == "COMPLETED", r
    return Completion.model_validate(r["output"][0])


def chat(loop, worker, model) -> ChatCompletion:
    r = run(loop, worker, {"openai_route": "/v1/chat/completions",
                           "openai_input": {"model": model, "messages": CHAT, **GREEDY}})
    assert r["status"] == "COMPLETED", r
    return ChatCompletion.model_validate(r["output"][0])


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, adapter_dirs):
    """The engine's own greedy texts of PROMPT and CHAT with each adapter's LoRARequest (None: the base)."""
    from engine import LLM, LoRARequest, SamplingParams

    llm = LLM(tiny_llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=64, max_model_len=256)
    params = SamplingParams(**GREEDY)
    loras = {None: None, "sql": LoRARequest("sql", 1, adapter_dirs["sql"]),
             "chat": LoRARequest("chat", 2, adapter_dirs["chat"])}
    return {name: (llm.generate(PROMPT, params, lora_request=lora)[0].outputs[0].text,
                   llm.generate({"messages": CHAT}, params, lora_request=lora)[0].outputs[0].text)
            for name, lora in loras.items()}


def test_openai_model_picks_the_adapter(lora_worker, loop, reference, tiny_llama_dir):
    base = completion(loop, lora_worker, tiny_llama_dir)  # the base model by its served name
    assert base.model == tiny_llama_dir and base.choices[0].text == reference[None][0]
    for name in ("sql", "chat"):
        got = completion(loop, lora_worker, name)
        assert got.model == name  # as vLLM answers: the adapter's name
        assert got.choices[0].text == reference[name][0] != reference[None][0]
        reply = chat(loop, lora_worker, name)
        assert reply.model == name and reply.choices[0].message.content == reference[name][1] != reference[None][1]
    assert reference["sql"] != reference["chat"]
    assert completion(loop, lora_worker, None).choices[0].text == reference[None][0]  # no model: the base


def test_streamed_chat_and_responses_with_an_adapter(lora_worker, loop, reference):
    r = run(loop, lora_worker, {"openai_route": "/v1/chat/completions", "openai_input": {
        "model": "sql", "messages": CHAT, "stream": True, **GREEDY}})
    assert r["status"] == "COMPLETED", r
    chunks = [ChatCompletionChunk.model_validate(json.loads(line[len("data: "):]))
              for item in r["output"] for line in item.split("\n") if line.startswith("data: {")]
    assert chunks and all(c.model == "sql" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reference["sql"][1]
    r = run(loop, lora_worker, {"openai_route": "/v1/responses", "openai_input": {
        "model": "sql", "input": CHAT[0]["content"], "max_output_tokens": 8, "temperature": 0}})
    assert r["status"] == "COMPLETED", r
    response = Response.model_validate(r["output"][0])
    assert response.model == "sql" and response.output_text
    # worker-vllm's route + body form
    r = run(loop, lora_worker, {"route": "/v1/completions", "body": {"model": "chat", "prompt": PROMPT, **GREEDY}})
    assert Completion.model_validate(r["output"][0]).choices[0].text == reference["chat"][0]


def test_models_lists_the_base_model_and_each_adapter(lora_worker, loop, tiny_llama_dir, adapter_dirs):
    r = run(loop, lora_worker, {"openai_route": "/v1/models"})
    cards = r["output"][0]["data"]
    models = [Model.model_validate(c) for c in cards]
    assert [m.id for m in models] == [tiny_llama_dir, "sql", "chat"]
    assert cards[0]["parent"] is None and cards[0]["root"] == tiny_llama_dir
    for card in cards[1:]:  # as vLLM lists adapters: root its path, parent the base model
        assert card["parent"] == tiny_llama_dir and card["root"] == adapter_dirs[card["id"]]
        assert card["max_model_len"] == 256


def test_native_lora_and_top_level_model(lora_worker, loop, reference, tiny_llama_dir):
    job = {"prompt": PROMPT, "sampling_params": GREEDY}
    assert text_of(run(loop, lora_worker, {**job, "lora": "sql"})) == reference["sql"][0]
    assert text_of(run(loop, lora_worker, {**job, "model": "chat"})) == reference["chat"][0]
    assert text_of(run(loop, lora_worker, {**job, "model": tiny_llama_dir})) == reference[None][0]
    assert text_of(run(loop, lora_worker, job)) == reference[None][0]
    chat_job = {"messages": CHAT, "sampling_params": GREEDY, "lora": "sql"}
    assert text_of(run(loop, lora_worker, chat_job)) == reference["sql"][1]
    r = run(loop, lora_worker, {**chat_job, "use_openai_format": True})
    assert ChatCompletion.model_validate(r["output"][0]).model == "sql"


@pytest.mark.parametrize("job_input, field", [
    ({"openai_route": "/v1/chat/completions", "openai_input": {"model": "nope", "messages": CHAT}},
     "openai_input.model"),
    ({"openai_route": "/v1/completions", "openai_input": {"model": "nope", "prompt": PROMPT}}, "openai_input.model"),
    ({"openai_route": "/v1/responses", "openai_input": {"model": "nope", "input": "Hi"}}, "openai_input.model"),
    ({"route": "/v1/chat/completions", "body": {"model": "nope", "messages": CHAT}}, "body.model"),
    ({"openai_route": "/v1/completions", "openai_input": {"model": 7, "prompt": PROMPT}}, "openai_input.model"),
    ({"prompt": PROMPT, "lora": "nope"}, "lora"),
    ({"prompt": PROMPT, "lora": {"name": "sql"}}, "lora"),
    ({"prompt": PROMPT, "model": "nope"}, "model"),
    ({"prompt": PROMPT, "model": "sql", "lora": "sql"}, "lora"),
    ({"openai_route": "/v1/completions", "model": "sql", "openai_input": {"prompt": PROMPT}}, "model"),
])
def test_an_unknown_model_or_adapter_fails_invalid_input_naming_the_field(lora_worker, loop, job_input, field):
    err = error_of(run(loop, lora_worker, job_input))
    assert err["code"] == "invalid_input" and err["field"] == field, err
    assert err["message"].startswith(field + ": ")


def test_without_lora_model_is_not_checked_and_lora_is_refused(shared_worker, loop):
    """No adapters: `model` stays as before (any name, the base model answers); `lora` names none."""
    r = run(loop, shared_worker, {"openai_route": "/v1/completions", "openai_input": {
        "model": "any-name", "prompt": PROMPT, **GREEDY}})
    assert r["status"] == "COMPLETED" and r["output"][0]["model"] != "any-name"
    assert run(loop, shared_worker, {"prompt": PROMPT, "model": "any-name", "sampling_params": GREEDY})["status"] == \
        "COMPLETED"
    err = error_of(run(loop, shared_worker, {"prompt": PROMPT, "lora": "sql"}))
    assert err["field"] == "lora" and "LORA_MODULES" in err["message"]
    assert len(run(loop, shared_worker, {"openai_route": "/v1/models"})["output"][0]["data"]) == 1


def test_an_adapter_refused_mid_run_fails_naming_the_jobs_field(tiny_llama_dir, adapter_dirs, tmp_path, loop):
    """One slot and one cached adapter: `chat` is read again when picked; its weights gone since the
    start, the engine's LoRAError is the job's invalid_input, with the adapter and the reason."""
    from handler.worker import Worker

    chat_dir = tmp_path / "chat"
    shutil.copytree(adapter_dirs["chat"], chat_dir)
    w = Worker(settings_for(tiny_llama_dir, MAX_LORA_RANK="8", MAX_LORAS="1",
                            LORA_MODULES=f"sql={adapter_dirs['sql']},chat={chat_dir}"))
    try:
        w.loader.load_now()
        (chat_dir / "adapter_model.safetensors").write_bytes(b"not safetensors")
        for job, field in (({"openai_route": "/v1/completions", "openai_input": {"model": "chat", "prompt": PROMPT}},
                            "openai_input.model"), ({"prompt": PROMPT, "lora": "chat"}, "lora"),
                           ({"prompt": PROMPT, "model": "chat"}, "model"),
                           ({"route": "/v1/completions", "body": {"model": "chat", "prompt": PROMPT}}, "body.model")):
            err = error_of(run(loop, w, job))
            assert err["code"] == "invalid_input" and err["field"] == field, err
            assert err["adapter"] == "chat" and err["reason"] == "bad_weights", err
        assert text_of(run(loop, w, {"prompt": PROMPT, "lora": "sql", "sampling_params": GREEDY}))  # the others run
    finally:
        loop.run_until_complete(w.aclose())


def test_the_log_line_and_metrics_name_the_adapter(lora_worker, loop, caplog):
    before = lora_worker.metrics.summary().get("lora_jobs", {}).get("sql", 0)
    with caplog.at_level(logging.INFO, logger="handler.worker"):
        run(loop, lora_worker, {"prompt": PROMPT, "lora": "sql", "sampling_params": GREEDY}, "job-sql")
        run(loop, lora_worker, {"prompt": PROMPT, "sampling_params": GREEDY}, "job-base")
    records = {r.job_id: r.job_finished for r in caplog.records if hasattr(r, "job_finished")}
    assert records["job-sql"]["lora"] == "sql" and "lora" not in records["job-base"]
    summary = lora_worker.metrics.summary()
    assert summary["lora_jobs"]["sql"] == before + 1
    assert summary["lora_slots_total"] == 2 and summary["lora_adapters_cached"] == 2
    from prometheus_client import generate_latest

    text = generate_latest(lora_worker.metrics.registry).decode()
    assert 'worker_lora_jobs_total{adapter="sql"}' in text and "worker_lora_slots_used" in text


def test_a_summarize_job_runs_every_call_with_its_adapter(lora_worker, loop, monkeypatch):
    """A long document's map and reduce calls all run with the job's adapter."""
    engine, seen = lora_worker.engine, []
    generate = engine.generate

    def recording(prompt, params=None, **kwargs):
        seen.append(kwargs.get("lora_request"))
        return generate(prompt, params, **kwargs)

    monkeypatch.setattr(engine, "generate", recording)
    doc = " ".join(["Meeting notes: the team discussed the budget, the roadmap and hiring plans.",
                    "Action items: Alice sends the report on Friday; Bob reviews the contract."] * 12)
    r = run(loop, lora_worker, {"summarize": {"text": doc, "max_tokens": 8}, "lora": "chat",
                                "sampling_params": {"ignore_eos": True}})
    assert r["status"] == "COMPLETED", r
    assert r["output"][-1]["summarize"]["chunks"] >= 2
    assert len(seen) >= 3 and all(lora is not None and lora.lora_name == "chat" for lora in seen), seen
