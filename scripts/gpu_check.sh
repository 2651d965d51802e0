#!/usr/bin/env bash
# gpu_check: the GPU acceptance checks and benchmarks in one run, for a GPU machine.
#
#   scripts/gpu_check.sh [BUILD_DIR] [checks|bench|all] [OUT_DIR]
#
# checks: the CUDA op and sampling tests, stories260k greedy ids on cuda vs the golden file, the HF parity
#         fixtures at bf16 tolerance, and greedy batch invariance on the fixtures with and without
#         a DuoAttention pattern.
# bench:  a random-weight Llama-3-8B-shaped checkpoint (written once to $LLAMA8B, default
#         /tmp/llama8b), bench_gpu (load, memory plan, decode at batch 1/8/64/256, prefill 2k/8k/32k,
#         batch-1 decode at a 32k context) and bench_serving on the ShareGPT trace against
#         `duoserve serve`, greedy and sampled (temperature 0.8, top-p 0.95, top-k 50).
# profile: per-op times at batch 1 (BENCH_PROFILE), every op's GPU time inside the decode graphs
#         (DUOSERVE_OP_TIMING), the kernels' time (nsys, when installed) and with NCU=1 their
#         speed-of-light, occupancy and warp-stall sections (ncu).
# Shared fixtures come from $SHARED (default ../shared, or .device/ where it was copied).
# Logs go to OUT_DIR (default $OUT, else /tmp/gpu_check). Exit status: the number of failed steps.
set -u
B=${1:-build}
WHAT=${2:-all}
OUTD=${3:-${OUT:-/tmp/gpu_check}}
SHARED=${SHARED:-$([ -d ../shared/models ] && echo ../shared || echo .device)}
LLAMA8B=${LLAMA8B:-/tmp/llama8b}
mkdir -p "$OUTD"
fails=0
step() { # name, command...
    local name=$1
    shift
    local t0=$SECONDS
    if "$@" >"$OUTD/$name.log" 2>&1; then
        echo "ok   $name ($((SECONDS - t0)) s)"
    else
        echo "FAIL $name ($((SECONDS - t0)) s): tail of $name.log:"
        tail -n 15 "$OUTD/$name.log"
        fails=$((fails + 1))
    fi
}

golden() {
    local want got
    want=$(python3 -c "import json; print(','.join(map(str, json.load(open('$SHARED/models/stories260k/expected_greedy_ids.json'))['greedy_ids'])))")
    got=$("$B/duoserve" generate -m "$SHARED/models/stories260k" --device cuda --prompt-ids 1 -n 199 --json |
        python3 -c "import json,sys; print(','.join(map(str, json.load(sys.stdin)['ids'])))")
    echo "want $want"
    echo "got  $got"
    [ -n "$got" ] && [ "$want" = "$got" ]
}

invariance() {
    local pat=/tmp/gpu_check_pattern.tsv rc=0
    printf '0.9\t0.1\n0.2\t0.8\n' >"$pat"
    for m in llama3 qwen2 mistral; do
        "$B/check_invariance" "tests/fixtures/hf/$m" cuda || rc=1
        "$B/check_invariance" "tests/fixtures/hf/$m" cuda "$pat" 0.5 || rc=1
    done
    # head dim 128 (the wgmma prefill kernel and the cooperative decode kernel): 2 layers, 1 KV head
    printf '0.9\n0.1\n' >"$pat.1"
    "$B/check_invariance" tests/fixtures/hf/llama_hd128 cuda || rc=1
    "$B/check_invariance" tests/fixtures/hf/llama_hd128 cuda "$pat.1" 0.5 || rc=1
    return $rc
}

# the random-weight 8B-shaped checkpoint, written once
llama8b() {
    [ -f "$LLAMA8B/config.json" ] || python3 scripts/make_llama8b.py "$LLAMA8B" --tokenizer "$SHARED/tokenizers/llama3"
}

# bench [GEMM]: bench_gpu with the invariant kernels (default) or cuBLAS
bench() {
    llama8b || return 1
    local pre=2048,8192,32768
    [ "${1:-invariant}" = invariant ] || pre=2048,8192 # 32k is attention-bound: the same either way
    timeout 400 "$B/bench_gpu" "$LLAMA8B" cuda --decode 1,8,64,256 --prefill "$pre" --gemm "${1:-invariant}"
}

# serving [GEMM [NAME BENCH_SERVING_ARGS...]]: bench_serving against duoserve serve
serving() {
    local port=18431 rc=0 extra=()
    [ $# -gt 2 ] && extra=("${@:3}")
    "$B/duoserve" serve -m "$LLAMA8B" --device cuda --port $port --max-num-seqs 64 --gemm "${1:-invariant}" >"$OUTD/server-${2:-${1:-invariant}}.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 240); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.5
    done
    timeout 300 python3 scripts/bench_serving.py --base-url "http://127.0.0.1:$port" \
        --dataset "$SHARED/traces/ShareGPT_V3_filtered_1000_prompts_only.json" \
        --output-lens-csv "$SHARED/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv" \
        --ignore-eos --max-concurrency 64 --num-prompts 300 --server-tokenize "${extra[@]}" || rc=1
    kill -TERM $pid
    wait $pid
    return $rc
}

if [ "$WHAT" = checks ] || [ "$WHAT" = all ]; then
    step op_test "$B/duoserve-test-cuda"
    step sampling_test "$B/duoserve-test-cuda-sampling"
    step golden_stories260k golden
    step parity python3 scripts/check_parity.py --bin "$B/duoserve" --device cuda --tol 0.05
    step invariance invariance
fi
profile() {
    llama8b || return 1
    BENCH_PROFILE=1 timeout 120 "$B/bench_gpu" "$LLAMA8B" cuda --decode 1 --prefill 2048 || return 1
    # the GPU time of every op of the decode steps, graphs included (CUDA events after each op)
    DUOSERVE_OP_TIMING=1 timeout 120 "$B/bench_gpu" "$LLAMA8B" cuda --decode 1 --prefill 0 || return 1
    # the decode kernels' time (Nsight Systems: cheap, every kernel of the graphs)
    local nsys
    nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n 1)
    if [ -n "$nsys" ]; then
        timeout 240 "$nsys" profile -o "$OUTD/decode" --force-overwrite true --cuda-graph-trace=node \
            "$B/bench_gpu" "$LLAMA8B" cuda --decode 1,8 --prefill 0 >/dev/null || return 1
        "$nsys" stats -q -r cuda_gpu_kern_sum "$OUTD/decode.nsys-rep" || return 1
    fi
    # NCU=1: the decode kernels' speed-of-light, occupancy and warp stalls (slow: it replays
    # kernels with the 16 GB of weights saved and restored)
    [ "${NCU:-0}" = 1 ] || return 0
    local ncu
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null) || return 0
    timeout 300 "$ncu" -k 'regex:gemm|flash_kernel|rmsnorm|rope|silu|append' --launch-skip 2000 \
        --launch-count 12 --replay-mode application --section SpeedOfLight --section Occupancy \
        --section WarpStateStats "$B/bench_gpu" "$LLAMA8B" cuda --decode 1 --prefill 0
}

if [ "$WHAT" = profile ]; then
    step profile profile
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
    for g in ${GEMMS:-invariant cublas}; do
        step "bench_gpu_$g" bench "$g"
        step "bench_serving_$g" serving "$g"
    done
    # one request decoding at a 32k context (split-KV decode), and sampled (not greedy) serving
    step bench_long_context timeout 120 "$B/bench_gpu" "$LLAMA8B" cuda --decode 1 --decode-ctx 32000 --prefill 0
    step bench_serving_sampled serving invariant sampled --temperature 0.8 --extra-body '{"top_p": 0.95, "top_k": 50}'

fi
exit $fails
