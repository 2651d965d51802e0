#!/bin/bash
# device_run.sh: one full GPU-machine run (checks, bench, A/B of every switch, op timing, ShareGPT).
# Expects .device/ prepared by ../shared/device/prepare.sh plus bin.txz (the stripped binaries of
# make CUDA=1 BUILD=build-gpu), models/stories260k, traces/ and tokenizers/llama3 copied from ../shared.
# Run with the device tool: command "bash scripts/device_run.sh", carry [".device"].
# run 2: fused norm (one-token GEMMs normalise their input), flash block-table prefetch, batched split-K partials, rmsnorm w prefetch, tile defaults
# MID1/BIG1, no split for big weight streams; checks, bench, A/B, op timing, profile, serving
set -u
source .device/env.sh
tar xJf .device/bin.txz -C /tmp
B=/tmp/bin; export SHARED=.device; L=/tmp/r; mkdir -p $L
export DUOSERVE_FUSED_SWIGLU=1 DUOSERVE_FUSED_NORM=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
( python3 scripts/make_llama8b.py /tmp/llama8b --tokenizer .device/tokenizers/llama3 > $L/mk8b.log 2>&1 ) &
mk=$!
t0=$SECONDS
scripts/gpu_check.sh $B checks $L
grep -E "FAIL|norm_matmul" $L/op_test.log | head -20; tail -1 $L/op_test.log
for v in "DUOSERVE_GEMM_MID=0 DUOSERVE_GEMM_BIG=0" "DUOSERVE_GEMM_MID=2 DUOSERVE_GEMM_BIG=2 DUOSERVE_GEMM_STREAM_M=16"; do
  env $v DUOSERVE_TEST_ONLY=matmul $B/duoserve-test-cuda > $L/op_gemm.log 2>&1; echo "op test GEMMs [$v]: $(grep FAIL $L/op_gemm.log | head -3) $(tail -1 $L/op_gemm.log)"; done
echo "checks done at $((SECONDS-t0)) s"
wait $mk; tail -1 $L/mk8b.log
echo "8b ready at $((SECONDS-t0)) s"
M=/tmp/llama8b
bg() { timeout 100 $B/bench_gpu $M cuda "$@"; }
bg --decode 1,8,64,256 --prefill 2048,32768 > $L/bench.log 2>&1; grep -E "decode|prefill" $L/bench.log | sed -E 's/ +/ /g'
ab() { local name=$1; shift; env "$@" timeout 100 $B/bench_gpu $M cuda --decode 1,8,64 --prefill 2048 > $L/ab_$name.log 2>&1; echo "== $name: $(grep -E 'decode|prefill' $L/ab_$name.log | sed -E 's/ +/ /g; s/ context 128//; s/ tokens\/s.*//; s/ms\/step,/ms/' | tr '\n' '|')"; }
ab nonorm DUOSERVE_FUSED_NORM=0
ab nofused DUOSERVE_FUSED_NORM=0 DUOSERVE_FUSED_SWIGLU=0
ab mid0_big0 DUOSERVE_GEMM_MID=0 DUOSERVE_GEMM_BIG=0
ab mid2_big2 DUOSERVE_GEMM_MID=2 DUOSERVE_GEMM_BIG=2
ab stream16 DUOSERVE_GEMM_STREAM_M=16
DUOSERVE_OP_TIMING=1 bg --decode 1 --prefill 0 > $L/optime.log 2>&1
DUOSERVE_OP_TIMING=1 bg --decode 64 --prefill 0 > $L/optime64.log 2>&1
BENCH_PROFILE=1 bg --decode 1 --prefill 0 > $L/profile.log 2>&1; grep "profile gemm" $L/profile.log | sed -E 's/ +/ /g; s/profile gemm //'
echo "bench done at $((SECONDS-t0)) s"
$B/duoserve serve -m $M --device cuda --port 18431 --max-num-seqs 64 > $L/server.log 2>&1 &
pid=$!
for _ in $(seq 1 240); do curl -sf http://127.0.0.1:18431/health >/dev/null 2>&1 && break; sleep 0.5; done
timeout -s INT 100 python3 scripts/bench_serving.py --base-url http://127.0.0.1:18431 --dataset $SHARED/traces/ShareGPT_V3_filtered_1000_prompts_only.json --output-lens-csv $SHARED/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv --ignore-eos --max-concurrency 64 --num-prompts 300 --server-tokenize > $L/serving.log 2>&1
kill -TERM $pid; wait $pid
grep -iE "throughput|ttft|tpot|success|fail" $L/serving.log | head -12
echo "all done at $((SECONDS-t0)) s"
tar czf $OUT/r2.tgz -C /tmp r
sed -n '/op timing/,$p' $L/optime.log | head -16; sed -n '/op timing/,$p' $L/optime64.log | head -12
