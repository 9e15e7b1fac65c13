"""The kernels' tuned configs on disk (llm_kernels/tune_cache.py) on CUDA: a second
process starting an engine on the same cache folder times no candidate, takes the
first one's choices and generates the same tokens."""
import json
import os
import subprocess
import sys

import pytest

from tests import models
from tests.gpu.conftest import ROOT

SCRIPT = """
import json, sys, time
t0 = time.monotonic()
from engine import LLM, SamplingParams
from llm_kernels import dispatch, tune_cache
llm = LLM(sys.argv[1], device="cuda", dtype="bfloat16", num_kv_blocks=512, max_num_seqs=16)
load_s = time.monotonic() - t0
out = llm.generate([{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 40, 90)],
                   SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
tune_cache.save()
print(json.dumps({"timed": len(dispatch.TIMINGS), "stored": len(tune_cache.active().entries),
                  "path": tune_cache.active().path, "load_s": load_s,
                  "tokens": [o.outputs[0].token_ids for o in out]}))
"""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return models.make_checkpoint(str(tmp_path_factory.mktemp("tc") / "qwen2"), "qwen2", seed=3,
                                  hidden_size=256, intermediate_size=512, num_attention_heads=8,
                                  num_key_value_heads=2, num_hidden_layers=2)


def _run(ckpt, cache_dir) -> dict:
    env = {**os.environ, "LLM_KERNELS_CACHE_DIR": str(cache_dir), "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-c", SCRIPT, ckpt], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_second_process_times_nothing_and_takes_the_first_ones_choices(ckpt, tmp_path):
    first = _run(ckpt, tmp_path)
    assert first["timed"] > 0 and first["stored"] >= first["timed"]
    assert os.path.dirname(first["path"]) == str(tmp_path)
    with open(first["path"]) as f:
        saved = json.load(f)["entries"]
    second = _run(ckpt, tmp_path)
    assert second["timed"] == 0, second
    assert second["path"] == first["path"] and second["stored"] == len(saved)
    assert second["tokens"] == first["tokens"]
    print(f"engine start: first process {first['load_s']:.1f} s ({first['timed']} keys timed), "
          f"second {second['load_s']:.1f} s (0 timed)")
