#!/usr/bin/env bash
# Issue 20's open proofs on the H200 in a few device calls, cheapest first, each step's output
# written to $OUT as it ends (a call cut by its limit still returns what it finished), the
# tuner's choices kept in .tunecache (LLM_KERNELS_CACHE_DIR) and packed into $OUT after every
# step: unpack that tarball into the repository before a later call and carry .tunecache, or
# the next machine tunes cold again (session 20 lost a call to that). K1's int4 peers need
# gemlite's source in .whl (benchmarks/int4_peers.py): carry it too.
#
#   run(command="OUT=$OUT bash benchmarks/device_plan.sh [STEP ...]", carry=[".tunecache", ".whl"])
#
# All steps take longer than one call (600 s): "tests k1" (580 s), then "e1" (560 s), then
# "ncu trace" (440 s), unpacking $OUT/tunecache.tgz into the repository between calls.
#
# Steps: tests (awq_mma/awq_tile GPU tests), k1 (K1 with both opt-in kernels, peers in the same
# run), ncu (Nsight Compute on kpack_ncu.py's awq_mma SC/MB and awq_tile cases), e1 (E1 with
# kpack only and the three opt-in modes), trace (the c=10 step trace for the host gap).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LLM_KERNELS_CACHE_DIR=$PWD/.tunecache PYTHONUNBUFFERED=1
mkdir -p "$LLM_KERNELS_CACHE_DIR"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests k1)

save() { tar czf "$OUT/tunecache.tgz" .tunecache 2>/dev/null; }
run() {  # run NAME SECONDS CMD...: time-limited, its output to $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date +%T), limit ${limit}s): $*"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name: exit $? at $(date +%T)"
    tail -n 5 "$OUT/$name.log"
    save
}

for step in "${steps[@]}"; do
    case $step in
        tests) run tests 280 python3 -m pytest -q -x tests/gpu/test_awq_mma_gpu.py ;;
        k1) run k1 290 env LLM_KERNELS_AWQ_MMA=1 \
                python3 benchmarks/kernel_bench.py --only K1 --ms 1,8,16,32,64,128,256 --skip-ckpt \
                --out "$OUT/kernels_k1.json" ;;
        ncu) run ncu 200 ncu --profile-from-start off --clock-control none --cache-control all \
                --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                --section SchedulerStats --section MemoryWorkloadAnalysis -o "$OUT/awq" \
                python3 benchmarks/kpack_ncu.py --cases 16,17,18,19,20,21,22,23
             python3 benchmarks/kpack_ncu.py --report "$OUT/awq.ncu-rep" > "$OUT/ncu_table.md" 2>&1 ;;
        e1) run e1 560 python3 benchmarks/serve.py --workloads E1 --awq-mma-too 1 small all \
                --out "$OUT/serve_e1.json" ;;
        trace) run trace 240 python3 benchmarks/step_trace.py --batch 10 --out "$OUT/trace" ;;
        *) echo "unknown step $step" ;;
    esac
done
