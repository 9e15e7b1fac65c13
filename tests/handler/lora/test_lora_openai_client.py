"""The `openai` client against the local endpoint's OpenAI routes of a worker serving adapters:
models.list() shows them, `model` picks one, an unknown name is a BadRequestError naming
openai_input.model."""
import pytest

from tests.handler.conftest import settings_for
from tests.handler.http.conftest import serve_worker

openai = pytest.importorskip("openai")


def test_the_openai_client_picks_adapters_by_model(tiny_llama_dir, served_env, loop):
    endpoint, base, close = serve_worker(settings_for(tiny_llama_dir, **served_env), loop)

    async def main():
        client = openai.AsyncOpenAI(base_url=base + "/v2/local/openai/v1", api_key="unchecked", max_retries=0)
        try:
            models = [m.id for m in (await client.models.list()).data]
            assert models == [tiny_llama_dir, "sql", "chat"]
            texts = {}
            for model in models:
                r = await client.completions.create(model=model, prompt="The quick brown fox", max_tokens=6,
                                                    temperature=0, extra_body={"ignore_eos": True})
                assert r.model == model
                texts[model] = r.choices[0].text
            assert len(set(texts.values())) == 3, texts  # each adapter answers, not the base model
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="no-such-adapter", max_tokens=4,
                                                     messages=[{"role": "user", "content": "Hi"}])
            assert info.value.status_code == 400 and info.value.body["code"] == "invalid_input"
            assert info.value.body["param"] == "openai_input.model"
        finally:
            await client.close()

    try:
        loop.run_until_complete(main())
    finally:
        close()
        loop.run_until_complete(endpoint.worker.aclose())
