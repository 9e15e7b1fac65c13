"""Run inside .venv-llmc (scripts/llmc_venv.sh), not by pytest: quantizes a tiny
checkpoint with llm-compressor's oneshot and saves it compressed, one scheme per
destination. Usage: llmc_produce.py SRC DST:SCHEME[:GROUP] ..."""
import sys

import torch
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
from transformers import AutoModelForCausalLM, AutoTokenizer


def recipe(scheme: str, group: int | None):
    if scheme.startswith("FP8"):
        return QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])
    if group is None:
        return GPTQModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])
    weights = {"num_bits": 4, "type": "int", "symmetric": not scheme.endswith("ASYM"), "strategy": "group",
               "group_size": group}
    return GPTQModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": weights}}, ignore=["lm_head"])


def main(src: str, jobs: list[str]) -> None:
    tok = AutoTokenizer.from_pretrained(src)
    g = torch.Generator().manual_seed(0)
    calib = Dataset.from_dict({"input_ids": [torch.randint(5, len(tok), (48,), generator=g).tolist() for _ in range(16)]})
    for job in jobs:
        dst, scheme, *group = job.split(":")
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        oneshot(model=model, dataset=calib, recipe=recipe(scheme, int(group[0]) if group else None),
                max_seq_length=48, num_calibration_samples=16)
        model.save_pretrained(dst, save_compressed=True)
        tok.save_pretrained(dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
