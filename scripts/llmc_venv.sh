#!/usr/bin/env bash
# Makes .venv-llmc: llm-compressor (which pins its own transformers) beside .venv, for
# the tests that quantize tiny models with it (tests/llmc_produce.py). About a minute
# on a clean machine (CPU torch from the pinned build first); safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LLMC_VENV:-.venv-llmc}
PY=${PYTHON:-python3}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llmcompressor" 2>/dev/null; then
    exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
"$VENV/bin/python" -m pip install -q "llmcompressor==${LLMCOMPRESSOR_VERSION:-0.14.0.1}"
echo "llmc_venv: $VENV ready ($("$VENV/bin/python" -c 'import llmcompressor, transformers; print("llmcompressor", llmcompressor.__version__, "transformers", transformers.__version__)'))"
