#!/usr/bin/env bash
# Rehearses the worker image's build without Docker, step for step as
# docker/Dockerfile does it, into a scratch root standing in for the image's /
# (.ci/run uses it only where Docker cannot run; scripts/build_image.sh builds
# and runs the real image):
#   1. the wheel stage's COPY lines (after .dockerignore), then `pip wheel`
#   2. every package file must be in the wheel (else the image lacks it)
#   3. a fresh venv, installed by docker/install.sh (CPU torch of the same
#      version instead of the CUDA build)
#   4. the model baked by docker/bake_model.py (default: the embedded model,
#      prepared on the CPU, offline)
#   5. one job through docker/start.sh -> python -m handler --test_input, run
#      from outside the repository (only installed files are visible), offline;
#      it must end COMPLETED with text, and nothing may be downloaded.
# It fails when any step fails: a file the image needs but the wheel lacks
# fails step 2 (or 4/5 when the check is skipped).
#
#   bash scripts/rehearse_image.sh
# Environment: REHEARSE_DIR (scratch folder; default a new temp folder, removed
# on success unless REHEARSE_KEEP=1), REHEARSE_WHEEL (use this wheel instead of
# building one), REHEARSE_SKIP_WHEEL_CHECK=1, REHEARSE_MODEL_NAME (bake this
# model or local folder instead of the default one), REHEARSE_JOB (the job JSON),
# REHEARSE_DEPS_FROM (a site-packages folder to take third-party packages from
# instead of installing them: a quick mode for tests, not a rehearsal of the
# install), PYTHON (the interpreter for the venv; default python3).
set -euo pipefail

# (all in one function: bash reads it whole, so editing this file while it
# runs does not change the run)
main() {
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
work=${REHEARSE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/rehearse-image.XXXXXX")}
mkdir -p "$work"
work=$(cd "$work" && pwd)
root=$work/root                 # stands in for the image's /
venv=$root/opt/venv             # the image's VIRTUAL_ENV
job=${REHEARSE_JOB:-'{"input": {"messages": [{"role": "user", "content": "What is the capital of France?"}], "sampling_params": {"max_tokens": 24, "temperature": 0}}}'}

case "$work" in "$repo"|"$repo"/*) echo "rehearse: REHEARSE_DIR must be outside the repository" >&2; exit 2;; esac
if [ -e "$root" ]; then echo "rehearse: $root exists; use an empty REHEARSE_DIR" >&2; exit 2; fi

t_all=$(date +%s)
declare -a timings=()
step_start=0
step() { step_start=$(date +%s); echo; echo "=== rehearse: $* ==="; }
done_step() { timings+=("$(printf '%-44s %4ss' "$1" $(( $(date +%s) - step_start )))"); }
fail() { echo "rehearse: FAILED: $*" >&2; echo "rehearse: scratch folder kept: $work" >&2; exit 1; }

tools() { "$py" "$repo/docker/deployfiles.py" "$@"; }

# -- 1. the wheel stage ---------------------------------------------------------
step "wheel stage: fresh venv, COPY (after .dockerignore), pip wheel"
"$py" -m venv "$venv" || fail "python -m venv"
"$venv/bin/python" --version
tools materialize wheel "$root" > /dev/null || fail "the wheel stage's COPY lines"
src=$root/src
if [ -n "${REHEARSE_WHEEL:-}" ]; then
    mkdir -p "$root/wheels"
    cp "$REHEARSE_WHEEL" "$root/wheels/"
    echo "using the given wheel $(basename "$REHEARSE_WHEEL")"
else
    (cd "$src" && "$venv/bin/python" -m pip wheel -q --no-deps --wheel-dir "$root/wheels" .) || fail "pip wheel"
fi
wheel=$(ls "$root"/wheels/runpod_llm_worker-*.whl)
echo "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
done_step "1. wheel"

# -- 2. the wheel holds every package file --------------------------------------
step "wheel contents against the package files"
if [ "${REHEARSE_SKIP_WHEEL_CHECK:-0}" = "1" ]; then
    echo "skipped (REHEARSE_SKIP_WHEEL_CHECK=1)"
else
    tools wheel-check "$wheel" "$src" || fail "the wheel lacks package files"
fi
done_step "2. wheel check"

# -- 3. a fresh venv, installed as the image is ---------------------------------
step "docker/install.sh into the venv (CPU torch)"
tools materialize worker "$root" > /dev/null || fail "the worker stage's COPY lines"
if [ -n "${REHEARSE_DEPS_FROM:-}" ]; then
    # quick mode for tests: third-party packages come from that site-packages
    # (after the venv's own), and only this package's wheel is installed
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    echo "$REHEARSE_DEPS_FROM" > "$site/_rehearse_deps.pth"
    echo "NOT a fresh install: dependencies reused from $REHEARSE_DEPS_FROM"
    "$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$wheel" || fail "pip install the wheel"
else
    # the image's TORCH_INDEX_URL is the CUDA wheel index; here the same torch
    # version comes from the ordinary index as a CPU build
    # the Dockerfile's three RUN steps
    install() {
        env -u TORCH_INDEX_URL -u PIP_REQUIRE_VIRTUALENV PIP_QUIET=1 PYTHON="$venv/bin/python" \
            sh "$root/opt/worker/install.sh" "$@" || fail "docker/install.sh $1"
    }
    install torch "$root/opt/worker/requirements.txt"
    PYTHON="$venv/bin/python" sh "$root/opt/worker/install.sh" deps-list "$root/opt/worker/requirements.txt" \
        "$repo/pyproject.toml" > "$root/opt/worker/deps.txt" || fail "docker/install.sh deps-list"
    install deps "$root/opt/worker/requirements.txt" "$root/opt/worker/deps.txt"
    install worker "$root/opt/worker/requirements.txt" "$root/wheels"
fi
(cd "$root" && "$venv/bin/python" -c "
import sys, torch, handler
assert handler.__file__.startswith(sys.prefix), f'handler imported from {handler.__file__}, not the venv'
print('torch', torch.__version__, '| handler from', handler.__file__)") || fail "the installed package"
done_step "3. install"

# The image's ENV (paths moved under the scratch root), its venv first on PATH,
# nothing of the repository or of the caller's Python setup visible.
eval "$(tools env worker "$root")"
export PATH=$venv/bin:$PATH VIRTUAL_ENV=$venv
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP HF_HOME HF_HUB_OFFLINE MODEL_NAME MODEL_REVISION QUANTIZATION || true
export PYTHONNOUSERSITE=1
cd "$root"

# -- 4. bake the model ------------------------------------------------------------
step "docker/bake_model.py ${REHEARSE_MODEL_NAME:-(the embedded default model)}"
MODEL_NAME=${REHEARSE_MODEL_NAME:-} python "$root/opt/worker/bake_model.py" "$BAKED_MODEL_DIR" \
    --token-file "$root/run/secrets/hf_token" || fail "bake_model.py"
du -sh "$BAKED_MODEL_DIR"
done_step "4. bake model"

# -- 5. one job through the image's entry point ------------------------------------
step "one job: start.sh --test_input (from $root/opt/worker, offline)"
cd "$root/opt/worker"
mkdir -p "$BASE_PATH"
sh "$root/opt/worker/start.sh" --test_input "$job" > "$work/result.json" 2> "$work/job.log" \
    || { tail -n 40 "$work/job.log" >&2; cat "$work/result.json" >&2; fail "the job did not complete"; }
grep -E "start.sh|cold start|loaded" "$work/job.log" || true
python - "$work/result.json" <<'EOF' || fail "the job's result"
import json, sys
result = json.load(open(sys.argv[1]))
assert result.get("status") == "COMPLETED", result
items = result["output"]
text = "".join(i.get("text", "") for i in items if isinstance(i, dict))
last = items[-1]
assert text.strip(), f"empty text: {result}"
assert last.get("finish_reason") in ("stop", "length"), last
print(f"COMPLETED, finish_reason {last['finish_reason']}, usage {last.get('usage')}: {text.strip()[:200]!r}")
EOF
downloads=$(find "$BASE_PATH" -type f | head -n 5)
[ -z "$downloads" ] || fail "the job wrote under BASE_PATH (a download?): $downloads"
done_step "5. job"

echo
echo "=== rehearse: passed in $(( $(date +%s) - t_all ))s ==="
printf '%s\n' "${timings[@]}"
if [ -z "${REHEARSE_DIR:-}" ] && [ "${REHEARSE_KEEP:-0}" != "1" ]; then
    rm -rf "$work"
else
    echo "scratch folder: $work"
fi
}

# on one line: bash has read it whole before main runs
main "$@"; exit $?
