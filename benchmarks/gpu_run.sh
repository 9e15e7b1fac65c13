#!/usr/bin/env bash
# The product's GPU proofs for a maintainer, in steps that each fit one 10-minute call on one
# H200 (tp: two). Each step writes its log to $OUT/STEP.log and its rows to $OUT/results/, and
# packs the tuner's cache into $OUT/tunecache.tgz, as soon as it ends: a call cut short still
# returns what it finished.
#
#   OUT=DIR BENCHMARK_COMMIT=<short hash> bash benchmarks/gpu_run.sh STEP [STEP ...]
#
# Steps (each under a time limit; benchmarks/README.md defines the ids):
#   tests       python3 -m pytest -q -n 4 --dist loadfile -m "not slow" tests/gpu, the default GPU test run
#   slow-kernels, slow-engine  the long variants (-m slow), kernels' files and the engine's, apart
#   kernels     K1-K4 (kernel_bench.py)
#   fp8-kernels K5 (quant_formats.py --only K5: the FP8 linear, the W8A16 kernel, W8A8, cuBLAS bf16)
#   lora        the LoRA kernel's long GPU tests (-m slow tests/gpu/test_lora_gpu.py), then L2 (lora.py)
#   formats     K1-fmt (quant_formats.py --only K1-fmt), then K2-fp8 (kv.py --only K2-fp8)
#   serve       E1 with --e1-weights awq bf16 (the HF peer, E1-fmt AWQ vs bf16), E3
#   fp8         E1-fmt FP8 vs bf16 (serve.py --e1-weights fp8 bf16 --skip-peer)
#   kv          E1-kv (kv.py --only E1-kv)
#   e2          E2, Llama-3-70B-AWQ shapes (serve.py --workloads E2)
#   moe         E4, Qwen3-30B-A3B-AWQ shapes (moe.py)
#   chunked     E1-chunked (chunked_prefill.py)
#   structured  G5 (structured.py; llguidance carried, see below)
#   profile     tools/step_profile.py at batch 10 and 50: $OUT/profile/ (summary.json, traces)
#   ncu         tools/ncu.py under Nsight Compute: $OUT/ncu.txt and $OUT/w4a16.ncu-rep
#   tp          E1-tp, tensor_parallel_size 1 and 2 (tp.py): on a machine of two GPUs
#   lora-serve  E1-lora: E1 c=50 with 8 rank-16 LoRA adapters against no adapter (lora_serve.py)
#
# The H200 machine has python3 3.12, torch 2.11, triton 3.6, transformers 5.17; no runpod, no
# llguidance, no jsonschema, no pytest-xdist, and no network. What it lacks travels in the ignored
# .whl/ folder, every .whl/*/site put on PYTHONPATH here (pytest-xdist and execnet, pure Python:
# their wheels unzipped into .whl/xdist/site); `python benchmarks/tools/structured_vendor.py
# --extra jsonschema` makes .whl/structured (llguidance, jsonschema, the SmolLM2 tokenizer) for
# the structured GPU tests and the structured step; K1's gemlite peer is read from
# .whl/peers/gemlite (benchmarks/int4_peers.py). The copy of the tree there has no git: pass
# the commit measured as BENCHMARK_COMMIT, or the rows say null.
#
# The tuner's cache travels from step to step: LLM_KERNELS_CACHE_DIR is .tunecache (ignored by
# git) unless set. Between calls, unpack the returned tarball into the checkout and carry it:
#
#   mkdir -p .tunecache && tar xzf FILES_AT/tunecache.tgz -C .tunecache
#   run(command="OUT=$OUT BENCHMARK_COMMIT=abc1234 bash benchmarks/gpu_run.sh serve",
#       carry=[".tunecache", ".whl"])
#
# Without it every call tunes cold again (minutes a model). The rows: each step starts from the
# checkout's benchmarks/results/<script>.json, copied into $OUT/results/ once, and replaces the
# rows of the cases it ran; copy $OUT/results/*.json over benchmarks/results/ to keep them.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then
    sed -n '2,/^set /p' "$0" | sed '$d'
    exit 2
fi
OUT=${OUT:-/tmp/gpu_run}
PY=${PYTHON:-python3}
RESULTS=$OUT/results
status=0
mkdir -p "$OUT" "$RESULTS"
export LLM_KERNELS_CACHE_DIR=${LLM_KERNELS_CACHE_DIR:-$PWD/.tunecache}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mkdir -p "$LLM_KERNELS_CACHE_DIR"
for site in .whl/*/site; do
    [ -d "$site" ] && export PYTHONPATH="$PWD/$site${PYTHONPATH:+:$PYTHONPATH}"
done
if [ -z "${BENCHMARK_COMMIT:-}" ] && ! git rev-parse --short HEAD > /dev/null 2>&1; then
    echo "note: no git here and BENCHMARK_COMMIT unset: the rows' commit will be null"
fi

out() {  # out NAME: the result file of benchmarks/NAME.py under $OUT, begun from the checkout's
    local file=$RESULTS/$1.json
    [ -f "$file" ] || [ ! -f "benchmarks/results/$1.json" ] || cp "benchmarks/results/$1.json" "$file"
    printf '%s' "$file"
}

run() {  # run STEP SECONDS CMD...: time-limited, its output appended to $OUT/STEP.log
    local step=$1 limit=$2 rc
    shift 2
    echo "== $step ($(date +%T), limit ${limit}s): $*" | tee -a "$OUT/$step.log"
    timeout "$limit" "$@" >> "$OUT/$step.log" 2>&1
    rc=$?
    echo "== $step: exit $rc at $(date +%T)" | tee -a "$OUT/$step.log"
    tail -n 8 "$OUT/$step.log"
    tar czf "$OUT/tunecache.tgz" -C "$LLM_KERNELS_CACHE_DIR" .
    [ "$rc" -eq 0 ] || status=$rc
}

for step in "${steps[@]}"; do
    case $step in
        tests) run tests 570 "$PY" -m pytest -q -n 4 --dist loadfile -m "not slow" tests/gpu ;;
        slow-kernels) run slow-kernels 570 "$PY" -m pytest -q -m slow tests/gpu/test_w4a16_gpu.py \
                          tests/gpu/test_gpu_kernels.py tests/gpu/test_quant_formats_gpu.py tests/gpu/test_moe_gpu.py \
                          tests/gpu/test_fp8_w8a16_gpu.py ;;
        slow-engine) run slow-engine 570 "$PY" -m pytest -q -m slow tests/gpu/test_engine_gpu.py \
                         tests/gpu/test_tp_gpu.py ;;
        kernels) run kernels 570 "$PY" benchmarks/kernel_bench.py --out "$(out kernel_bench)" ;;
        fp8-kernels) run fp8-kernels 570 "$PY" benchmarks/quant_formats.py --only K5 --out "$(out quant_formats)" ;;
        lora) run lora 240 "$PY" -m pytest -q -m slow tests/gpu/test_lora_gpu.py
              run lora 300 "$PY" benchmarks/lora.py --out "$(out lora)" ;;
        formats) run formats 420 "$PY" benchmarks/quant_formats.py --only K1-fmt --out "$(out quant_formats)"
                 run formats 150 "$PY" benchmarks/kv.py --only K2-fp8 --out "$(out kv)" ;;
        serve) run serve 570 "$PY" benchmarks/serve.py --workloads E3 E1 --e1-weights awq bf16 --out "$(out serve)" ;;
        fp8) run fp8 570 "$PY" benchmarks/serve.py --workloads E1 --e1-weights fp8 bf16 --skip-peer \
                 --out "$(out serve)" ;;
        kv) run kv 570 "$PY" benchmarks/kv.py --only E1-kv --out "$(out kv)" ;;
        e2) run e2 570 "$PY" benchmarks/serve.py --workloads E2 --out "$(out serve)" ;;
        moe) run moe 570 "$PY" benchmarks/moe.py --out "$(out moe)" ;;
        chunked) run chunked 570 "$PY" benchmarks/chunked_prefill.py --out "$(out chunked_prefill)" ;;
        structured) run structured 570 "$PY" benchmarks/structured.py --out "$(out structured)" ;;
        profile) run profile 400 "$PY" benchmarks/tools/step_profile.py --batch 10 50 --out "$OUT/profile" ;;
        ncu) run ncu 400 ncu --profile-from-start off --clock-control none --cache-control all \
                 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                 --section SchedulerStats --section MemoryWorkloadAnalysis -f -o "$OUT/w4a16" \
                 "$PY" benchmarks/tools/ncu.py
             "$PY" benchmarks/tools/ncu.py --report "$OUT/w4a16.ncu-rep" > "$OUT/ncu.txt" 2>&1 ;;
        tp) run tp 570 "$PY" benchmarks/tp.py --tp 1 2 --out "$(out tp)" ;;
        lora-serve) run lora-serve 570 "$PY" benchmarks/lora_serve.py --out "$(out lora_serve)" ;;
        *) echo "unknown step $step (see the header of $0)"; status=2 ;;
    esac
done
exit "$status"
