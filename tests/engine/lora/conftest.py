"""Adapters of the tiny Llama made by peft (B random, so they change the output)."""
import pytest

from tests import lora_adapters


@pytest.fixture(scope="session")
def adapters(tiny_llama_dir, tmp_path_factory):
    """Three adapters of the tiny Llama: every projection at rank 8; attention only at rank 4 with
    rsLoRA; the MLP only at rank 8, alpha 32."""
    root = tmp_path_factory.mktemp("adapters")
    return {
        "all": lora_adapters.make_adapter(tiny_llama_dir, str(root / "all"), seed=11),
        "attn": lora_adapters.make_adapter(tiny_llama_dir, str(root / "attn"), seed=12, r=4, alpha=8,
                                           targets=lora_adapters.ATTN, use_rslora=True),
        "mlp": lora_adapters.make_adapter(tiny_llama_dir, str(root / "mlp"), seed=13, alpha=32,
                                          targets=lora_adapters.MLP),
    }
