"""Tests of handler.prepare.quantize: the CPU fix for AutoAWQ, calibration blocks, dequantization, the CLI."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("awq")
transformers = pytest.importorskip("transformers")

from handler.prepare import quantize as Q  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _train_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(Q.read_calibration_texts(Q.DEFAULT_CALIBRATION), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def _outlier_llama(folder: Path, seed: int = 0) -> None:
    """A tiny random Llama whose input channels differ in scale, as in trained models.

    With uniform random weights AWQ's per-channel scales are all about 1 and the
    CPU aliasing bug would go unnoticed; real models have outlier channels.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                p.copy_(torch.randn_like(p) * 0.08 * torch.randn(p.shape[1]).mul(0.8).exp())
            elif "norm" in name:
                p.copy_(torch.rand_like(p) * 1.5 + 0.25)
            elif "embed" in name:
                p.normal_()  # logits of a useful size, not ~0
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    _outlier_llama(folder)
    _train_tokenizer(folder)
    return folder


def _float_logits(folder: Path, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


def _round_to_nearest_logits(folder: Path, ids, group_size: int):
    """Logits with every linear weight rounded to 4 bits per group, no AWQ scaling: the baseline."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                w = module.weight.reshape(-1, group_size)
                lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
                scale = (hi - lo).clamp(min=1e-5) / 15
                zero = (-torch.round(lo / scale)).clamp(0, 15)
                q = (torch.clamp(torch.round(w / scale) + zero, 0, 15) - zero) * scale
                module.weight.copy_(q.reshape(module.weight.shape))
        return model(ids).logits


def _rel_error(reference, other) -> float:
    return float((reference - other).norm() / reference.norm())


def _eval_ids(folder: Path):
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = ("The lighthouse keeper climbed the stairs every evening to light the lamp, "
            "so that the fishing boats could find the harbour in the fog.")
    return torch.tensor([tok(text)["input_ids"]])


SMALL = Q.QuantSettings(group_size=32, samples=8, seq_len=32)


@pytest.fixture(scope="module")
def quantized_tiny(tiny_model, tmp_path_factory) -> Path:
    """The tiny model quantized the normal way (with the CPU fix)."""
    return Q.quantize_checkpoint(tiny_model, tmp_path_factory.mktemp("q") / "awq", SMALL)


def test_cpu_fix_keeps_quantized_model_close_to_float(tiny_model, quantized_tiny, tmp_path, monkeypatch):
    ids = _eval_ids(tiny_model)
    reference = _float_logits(tiny_model, ids)

    fixed = quantized_tiny
    monkeypatch.setattr(Q, "awq_cpu_fix", contextlib.nullcontext)  # AutoAWQ as shipped
    broken = Q.quantize_checkpoint(tiny_model, tmp_path / "broken", SMALL)

    with torch.no_grad():
        err_fixed = _rel_error(reference, Q.load_dequantized_model(fixed)(ids).logits)
        err_broken = _rel_error(reference, Q.load_dequantized_model(broken)(ids).logits)
        err_rtn = _rel_error(reference, _round_to_nearest_logits(tiny_model, ids, SMALL.group_size))
    # AWQ with the fix is at least as good as plain rounding; without it, far worse
    assert err_fixed <= 1.05 * err_rtn, (err_fixed, err_rtn)
    assert err_broken > 2 * err_fixed, (err_broken, err_fixed)


def test_cpu_fix_is_scoped_to_the_with_block():
    from awq.quantize.quantizer import AwqQuantizer

    original = AwqQuantizer._compute_best_scale
    with Q.awq_cpu_fix():
        assert AwqQuantizer._compute_best_scale is not original
    assert AwqQuantizer._compute_best_scale is original


def test_snapshot_copy_does_not_alias_live_weights():
    layer = torch.nn.Linear(4, 4)
    with Q._state_dict_snapshots_copy(layer):
        snapshot = layer.state_dict()
    layer.weight.data.mul_(2)
    assert not torch.equal(snapshot["weight"], layer.weight)
    assert "state_dict" not in vars(layer)
    assert layer.state_dict()["weight"].data_ptr() == layer.weight.data_ptr()


def test_dequantization_matches_autoawq(quantized_tiny):
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file

    raw = load_file(quantized_tiny / "model.safetensors")
    base = "model.layers.0.mlp.down_proj"
    ours = Q.dequantize_awq_linear(raw[f"{base}.qweight"], raw[f"{base}.qzeros"],
                                   raw[f"{base}.scales"], 32)
    theirs = dequantize_gemm(raw[f"{base}.qweight"], raw[f"{base}.qzeros"], raw[f"{base}.scales"], 4, 32)
    torch.testing.assert_close(ours, theirs.float().t(), rtol=2e-3, atol=2e-4)  # theirs is fp16
    assert ours.shape == (64, 128)


def test_calibration_blocks_are_full_and_chat_formatted(tiny_model):
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model)
    texts = Q.read_calibration_texts(Q.DEFAULT_CALIBRATION)
    assert len(texts) > 30
    blocks = Q.calibration_blocks(tok, texts, samples=6, seq_len=40)
    assert len(blocks) == 6 and all(len(b) == 40 for b in blocks)
    stream = [i for t in texts for i in Q._encode(tok, t)]
    start = tok.convert_tokens_to_ids("<|im_start|>")
    assert start in stream  # 'User:/Assistant:' blocks went through the chat template
    # more blocks asked than the text holds: what it holds, with a warning
    assert len(Q.calibration_blocks(tok, texts[:2], samples=1000, seq_len=16)) < 1000
    with pytest.raises(ValueError):
        Q.calibration_blocks(tok, ["a b"], samples=1, seq_len=512)


def test_chat_block_parsing():
    messages = Q._as_chat("User: Hi there\nsecond line\nAssistant: Hello!")
    assert messages == [{"role": "user", "content": "Hi there\nsecond line"},
                        {"role": "assistant", "content": "Hello!"}]
    assert Q._as_chat("Plain text about User: nothing") is None


def test_jsonl_calibration(tmp_path):
    path = tmp_path / "calib.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert Q.read_calibration_texts(path) == ["one", "two"]
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError):
        Q.read_calibration_texts(tmp_path / "empty.txt")


def test_group_size_picked_to_fit(tiny_model, tmp_path):
    assert Q.pick_group_size(tiny_model) == 64  # hidden 64, intermediate 128
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 576, "intermediate_size": 1536}))
    assert Q.pick_group_size(tmp_path) == 64  # SmolLM2-135M: 576 is not a multiple of 128
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4096, "intermediate_size": 11008}))
    assert Q.pick_group_size(tmp_path) == 128


def test_group_size_must_divide_dimensions(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="does not divide"):
        Q.quantize_checkpoint(tiny_model, tmp_path / "x", Q.QuantSettings(group_size=128))
    assert not (tmp_path / "x").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary folder left


def test_cli_writes_a_loadable_awq_checkpoint(tiny_model, tmp_path):
    out = tmp_path / "awq"
    assert Q.main([str(tiny_model), str(out), "--group-size", "64", "--samples", "4", "--seq-len", "32"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm",
        "modules_to_not_convert": None}
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (out / "tokenizer.json").is_file()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.chat_template
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.layers.0.self_attn.q_proj.qweight").dtype == torch.int32
        assert f.get_tensor("model.layers.0.self_attn.q_proj.scales").shape == (1, 64)
    assert "lm_head.weight" not in names  # tied to the embeddings
    ids = _eval_ids(tiny_model)
    with torch.no_grad():
        err = _rel_error(_float_logits(tiny_model, ids), Q.load_dequantized_model(out)(ids).logits)
    assert err < 0.5, err


def test_cli_refuses_existing_output(tiny_model, tmp_path):
    """Also checks that `python -m handler.prepare.quantize` is wired up (it fails before loading torch)."""
    proc = subprocess.run([sys.executable, "-m", "handler.prepare.quantize", str(tiny_model), str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "already exists" in proc.stderr


def test_quantization_reports_each_layer_with_the_time_left(tiny_model, tmp_path):
    messages: list[str] = []
    Q.quantize_checkpoint(tiny_model, tmp_path / "awq", SMALL, progress=messages.append)
    layers = [m for m in messages if m.startswith("AWQ layer")]
    assert [m.split(" quantized")[0] for m in layers] == ["AWQ layer 1 of 2", "AWQ layer 2 of 2"]
    assert all(" a layer, about " in m and m.endswith(" left)") for m in layers), layers
    assert layers[-1].endswith("about 0 s left)")


def test_the_cli_shows_layers_and_no_third_party_banner(tiny_model, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "handler.prepare.quantize", str(tiny_model), str(tmp_path / "q"),
                           "--samples", "4", "--seq-len", "32"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "AWQ layer 2 of 2 quantized" in proc.stderr  # one log line a layer, also when stderr is a file
    assert "AutoAWQ is officially deprecated" not in proc.stderr and "final dev message" not in proc.stderr
    assert "torch_dtype" not in proc.stderr  # transformers' deprecation of the old keyword: we pass dtype


def test_only_the_autoawq_banner_is_filtered():
    code = ("import warnings\nfrom handler.prepare.awq_progress import import_awq\nimport_awq()\n"
            "warnings.warn('a real deprecation', DeprecationWarning)\n"
            "import awq.utils\nwarnings.warn_explicit('elsewhere', DeprecationWarning, 'x.py', 1, module='other')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final dev message" not in proc.stderr
    assert "a real deprecation" in proc.stderr  # __main__'s own warnings still show, as Python's defaults say
    assert "elsewhere" not in proc.stderr  # and AutoAWQ no longer turns every package's deprecations on
