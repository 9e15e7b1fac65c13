"""Shared fixtures: tiny random checkpoints made once per test session."""
import pytest

from tests import models


@pytest.fixture(scope="session", autouse=True)
def float32_on_the_cpu():
    """The CPU suite runs the engine in float32 explicitly (dtype "auto" would pick bfloat16 on
    CPUs with native bf16 matmuls, as CI's has): greedy parity with transformers float32 is only
    meaningful in float32. tests/engine/test_dtype_auto.py covers the bfloat16 choice itself;
    benchmarks/cpu.py C1 measures both dtypes. Session-scoped, so it precedes every engine
    fixture; processes a test starts (python -m handler) keep the real choice."""
    from engine import llm_engine

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llm_engine, "cpu_has_native_bf16", lambda: False)
        yield


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpts")


@pytest.fixture(scope="session")
def tiny_llama_dir(ckpt_dir):
    """Llama with llama3 rope scaling, GQA, and a chat template."""
    return models.make_checkpoint(
        str(ckpt_dir / "llama"), "llama",
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    )


@pytest.fixture(scope="session")
def tiny_qwen2_dir(ckpt_dir):
    """Qwen2 with q/k/v biases and tied embeddings."""
    return models.make_checkpoint(str(ckpt_dir / "qwen2"), "qwen2", seed=1)


@pytest.fixture(scope="session")
def tiny_mistral_dir(ckpt_dir):
    """Mistral without sliding window, MQA (one KV head)."""
    return models.make_checkpoint(str(ckpt_dir / "mistral"), "mistral", seed=2, num_key_value_heads=1)


@pytest.fixture(scope="session")
def tiny_mistral_sw_dir(ckpt_dir):
    """Mistral with a sliding window of 24 on every layer (prompts run to 200)."""
    return models.make_checkpoint(str(ckpt_dir / "mistral-sw"), "mistral", seed=3, sliding_window=24)


@pytest.fixture(scope="session")
def tiny_qwen2_sw_dir(ckpt_dir):
    """Qwen2 with use_sliding_window: layer 0 full, layer 1 a window of 20 (max_window_layers 1)."""
    return models.make_checkpoint(str(ckpt_dir / "qwen2-sw"), "qwen2", seed=4, use_sliding_window=True,
                                  sliding_window=20, max_window_layers=1)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(ckpt_dir):
    """Qwen3: q/k norms, head_dim 32 (not hidden / heads), yarn rope scaling."""
    return models.make_checkpoint(
        str(ckpt_dir / "qwen3"), "qwen3", seed=5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 128})


@pytest.fixture(scope="session")
def tiny_phi3_dir(ckpt_dir):
    """Phi-3/4: fused qkv and gate_up, longrope (original 64: prompts cross it), partial rotary 0.75,
    a sliding window of 48."""
    return models.make_checkpoint(str(ckpt_dir / "phi3"), "phi3", seed=6, sliding_window=48)


GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}}


@pytest.fixture(scope="session")
def tiny_gemma3_dir(ckpt_dir):
    """Gemma 3 text: sliding (window 24) / full / sliding layers, their own rope bases, q/k norms."""
    return models.make_checkpoint(
        str(ckpt_dir / "gemma3"), "gemma3", seed=7, num_hidden_layers=3, sliding_window=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], rope_parameters=GEMMA3_ROPE)


@pytest.fixture(scope="session")
def tiny_gemma2_dir(ckpt_dir):
    """Gemma 2: alternating sliding (window 16) / full layers, attention and final-logit soft-capping."""
    return models.make_checkpoint(str(ckpt_dir / "gemma2"), "gemma2", seed=8, sliding_window=16,
                                  attn_logit_softcapping=2.0, final_logit_softcapping=5.0)
