"""LoRA adapters of the tiny Llama made by peft (B random, so they change the output), and a
worker on the tiny Llama serving two of them."""
import pytest

from tests import lora_adapters
from tests.handler.conftest import settings_for

# the settings of a worker serving two adapters (the paths filled in by `served_env`)
ENV = {"MAX_LORAS": "2", "MAX_LORA_RANK": "8"}


@pytest.fixture(scope="session")
def adapter_dirs(tiny_llama_dir, tmp_path_factory):
    """Two adapters of the tiny Llama: every projection at rank 8 ("sql"); attention only at rank 4 ("chat")."""
    root = tmp_path_factory.mktemp("lora-adapters")
    return {
        "sql": lora_adapters.make_adapter(tiny_llama_dir, str(root / "sql"), seed=21),
        "chat": lora_adapters.make_adapter(tiny_llama_dir, str(root / "chat"), seed=22, r=4, alpha=8,
                                           targets=lora_adapters.ATTN),
    }


@pytest.fixture(scope="session")
def served_env(adapter_dirs) -> dict:
    return {**ENV, "LORA_MODULES": f"sql={adapter_dirs['sql']} chat={adapter_dirs['chat']}"}


@pytest.fixture(scope="module")
def lora_worker(tiny_llama_dir, served_env, loop):
    """A worker on the tiny Llama serving the adapters `sql` (lora_int_id 1) and `chat` (2), loaded."""
    from handler.worker import Worker

    w = Worker(settings_for(tiny_llama_dir, **served_env))
    w.loader.load_now()  # as a worker with MODEL_NAME does at start: the adapters are checked here
    yield w
    loop.run_until_complete(w.aclose())
