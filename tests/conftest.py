"""Shared fixtures: tiny random checkpoints made once per test session."""
import pytest

from tests import models


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
