#!/bin/bash
# device_run.sh: one GPU-machine run of the checks, benchmarks, A/B of the switches, kernel
# traces and ShareGPT serving; the stages to run are the arguments (default: all of them).
#
#   [AB="name:VAR=v,..."] [TRACE_AB="name:VAR=v,..."] bash scripts/device_run.sh [attnbench] [prefillbench] [optest] [kvgolden] [ncuattn] [gemm] [gemmab] [ncu] [checks] [bench] [gemmprof] [gemmbench] [stamps] [ab] [variants] [longdec] [trace] [optime] [serving] [sharegpt] [multiturn] [longprefill] [tp]
#
# Expects .device/ as scripts/device_pack.sh leaves it (run there first): bin.txz (the stripped
# binaries of make CUDA=1 BUILD=build-gpu, libktrace.so and libcupti.so.13 in bin/),
# models/stories260k, traces/ and tokenizers/llama3 copied from ../shared. Run with the device tool: command
# "bash scripts/device_run.sh ...", carry [".device"]. Logs and traces are written straight to $OUT/r
# (so a run cut off by the command limit still brings back what it wrote).
set -u
stages=${*:-attnbench checks bench gemmprof stamps ab trace optime serving}
has() { [[ " $stages " == *" $1 "* ]]; }
source .device/env.sh
tar xJf .device/bin.txz -C /tmp
B=/tmp/bin; export SHARED=.device; L=${OUT:-/tmp}/r; mkdir -p $L
export LD_LIBRARY_PATH=$B:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
M=/tmp/llama8b
mk=
needs_8b() { for st in bench gemmprof gemmbench stamps ab variants longdec trace optime serving sharegpt multiturn longprefill; do has $st && return 0; done; return 1; }
if needs_8b && [ ! -f $M/tokenizer_config.json ]; then # (written last; kept from an earlier call on a warm machine)
  rm -f $M.ready
  ( python3 scripts/make_llama8b.py $M --tokenizer .device/tokenizers/llama3 > $L/mk8b.log 2>&1; touch $M.ready ) &
  mk=$!
fi
t0=$SECONDS
at() { echo "   [$1 done at $((SECONDS-t0)) s]"; }
if has attnbench; then # one decode token's attention at several contexts; FA_CLOCKS build: phase stamps
  { echo "== attnbench"; DUOSERVE_TEST_ONLY=attnbench $B/duoserve-test-cuda
    [ -x $B/duoserve-test-cuda-clk ] && DUOSERVE_TEST_ONLY=attnbench $B/duoserve-test-cuda-clk
  } 2>&1 | tee $L/attnbench.log
fi
# issue 21: one Llama-3-8B layer's causal prefill attention alone (DUOSERVE_TEST_ONLY=prefillbench:
# ms a call and TFLOP/s at PREFILLBENCH_N tokens, default 2k, 8k, 32k, 128k), as built and again
# under each of PREFILLBENCH_AB="name:VAR=v,... ..." and in each compile-time variant of PREFILLBENCH_VARIANTS
# ("name ...": device_pack.sh's duoserve-test-cuda-NAME)
if has prefillbench; then
  pbench() { local name=$1 bin=$2; shift 2; echo "== prefillbench $name"
    timeout 90 env "$@" DUOSERVE_TEST_ONLY=prefillbench $bin 2>&1 | tee $L/prefillbench_$name.log | grep -E "prefillbench|FAIL|error"; }
  for spec in "default:" ${PREFILLBENCH_AB:-}; do pbench ${spec%%:*} $B/duoserve-test-cuda $(echo "${spec#*:}" | tr ',' ' '); done
  for v in ${PREFILLBENCH_VARIANTS:-}; do pbench v_$v $B/duoserve-test-cuda-$v; done
fi
# the op test alone, as built and again under OPTEST_ENV="VAR=v,..." (a new path behind a switch);
# each run stopped after OPTEST_TIMEOUT s (300); OPTEST_SKIP_PLAIN=1: only the OPTEST_ENV runs;
# OPTEST_VARIANTS="name ...": device_pack.sh's duoserve-test-cuda-NAME too, each under the first
# OPTEST_ENV set (or none), all variants at once (the GPU shared; the CPU references take the time)
if has optest; then
  runs=(); [ "${OPTEST_SKIP_PLAIN:-0}" = 1 ] || runs+=("")
  for v in ${OPTEST_ENV:-}; do runs+=("$v"); done
  for v in "${runs[@]}"; do
    f=$L/optest$(echo "$v" | tr -c 'A-Za-z0-9\n' '_').log
    timeout ${OPTEST_TIMEOUT:-300} env $(echo "$v" | tr ',' ' ') $B/duoserve-test-cuda > $f 2>&1
    echo "op test [$v] (rc $?): $(grep FAIL $f | head -5) $(tail -1 $f)"
  done
  e1=$(echo "${OPTEST_ENV:-}" | awk '{print $1}' | tr ',' ' '); pids=
  for n in ${OPTEST_VARIANTS:-}; do
    ( timeout ${OPTEST_TIMEOUT:-300} env $e1 $B/duoserve-test-cuda-$n > $L/optest_v_$n.log 2>&1; echo "rc $?" >> $L/optest_v_$n.log ) &
    pids="$pids $!"
  done
  [ -z "$pids" ] || wait $pids
  for n in ${OPTEST_VARIANTS:-}; do f=$L/optest_v_$n.log; echo "op test variant $n [$e1] ($(tail -1 $f)): $(grep FAIL $f | head -5) $(tail -2 $f | head -1)"; done
fi
# greedy ids on stories260k with each KV cache dtype (KVGOLDEN_DTYPES, default "auto fp8"), CUDA
# against the CPU reference, and auto against the golden file
if has kvgolden; then
  want=$(python3 -c "import json; print(','.join(map(str, json.load(open('$SHARED/models/stories260k/expected_greedy_ids.json'))['greedy_ids'])))")
  for k in ${KVGOLDEN_DTYPES:-auto fp8}; do
    for d in cuda cpu; do
      $B/duoserve generate -m $SHARED/models/stories260k --device $d --kv-cache-dtype $k --prompt-ids 1 -n 199 --json 2> $L/kvgolden_${d}_$k.err |
        python3 -c "import json,sys; print(','.join(map(str, json.load(sys.stdin)['ids'])))" > $L/kvgolden_${d}_$k.ids 2>> $L/kvgolden_${d}_$k.err
    done
    c=$(cat $L/kvgolden_cuda_$k.ids)
    same=NO; [ -n "$c" ] && [ "$c" = "$(cat $L/kvgolden_cpu_$k.ids)" ] && same=yes
    gold=; [ $k = auto ] && { gold=", == golden: NO"; [ "$c" = "$want" ] && gold=", == golden: yes"; }
    echo "kvgolden $k: cuda == cpu: $same$gold"
    [ -n "$c" ] || head -2 $L/kvgolden_cuda_$k.err
  done
fi
# the op test's GEMM cases alone (a new GEMM kernel first: the benchmarks after it are skipped if it fails)
# (GEMM_ENV="VAR=v,... ...": again under each set of switches, all at once)
if has gemm; then
  i=0; pids=; for v in "" ${GEMM_ENV:-}; do
    ( timeout 300 env $(echo "$v" | tr ',' ' ') DUOSERVE_TEST_ONLY=matmul $B/duoserve-test-cuda > $L/op_gemm$i.log 2>&1 ) &
    pids="$pids $!"; i=$((i+1))
  done; wait $pids # (not the 8B checkpoint's writer)
  i=0; fail=0; for v in "" ${GEMM_ENV:-}; do
    f=$L/op_gemm$i.log; i=$((i+1))
    echo "op test GEMMs [$v]: $(grep -c FAIL $f) FAIL lines; $(tail -1 $f)"
    grep -E "FAIL" $f | head -12; grep -E "^(ok|FAIL) (qkv|o|gate|down|LM)" $f | cut -c1-150
    grep -q " 0 failed" $f || fail=1
  done
  at gemm
  [ $fail = 0 ] || [ -n "${GEMM_NOFAIL:-}" ] || { echo "GEMM op test failed: no benchmarks"; exit 1; }
fi
# each Llama-3-8B GEMM alone under the wgmma tiles' speed choices and cuBLAS (no model needed)
if has gemmab; then
  timeout 300 env DUOSERVE_TEST_ONLY=gemmbench $B/duoserve-test-cuda 2>&1 | tee $L/gemmab.log | sed -E 's/ +/ /g'
fi
# Nsight Compute on one GEMM call each (NCU="qkv,2048,w3d:gemm_wg qkv,2048,cublas:sm90 ...": GEMMBENCH_ONLY and a kernel-name regex)
NCU_SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats"
if has ncu; then
  for spec in ${NCU:-}; do
    n=$(echo "${spec%%:*}" | tr ',|' '__')
    GEMMBENCH_ONLY="${spec%%:*}" DUOSERVE_TEST_ONLY=gemmbench timeout 200 ncu --clock-control none --kernel-name "regex:${spec#*:}" \
      --launch-skip 2 --launch-count 1 $NCU_SECTIONS $B/duoserve-test-cuda > $L/ncu_$n.txt 2>&1
    echo "== ncu $spec"; grep -E "Duration|Throughput|Pipe|Busy|Stall|Issued|Eligible|Hit Rate|Bandwidth|L2|Shared" $L/ncu_$n.txt | head -40
  done
fi
# Nsight Compute on the attention kernels (issues 21, 22): NCU_ATTN="bench:kernel-regex ..." runs
# DUOSERVE_TEST_ONLY=bench (prefillbench at PREFILLBENCH_N, default 32768; attnbench at ATTNBENCH_CTX,
# default 32000) and profiles
# one call of each kernel the regex names (default: the wgmma prefill kernel and the flash kernel
# in prefillbench, the flash kernel's decode in attnbench)
if has ncuattn; then
  for spec in ${NCU_ATTN:-prefillbench:fa_prefill_wg prefillbench:flash_kernel attnbench:flash_kernel}; do
    bn=${spec%%:*}; n=${bn}_$(echo "${spec#*:}" | tr -c 'A-Za-z0-9\n' '_'); sw=; [[ "${spec#*:}" == flash* && $bn == prefillbench ]] && sw=DUOSERVE_ATTN_WG=0
    env $sw PREFILLBENCH_N=${PREFILLBENCH_N:-32768} ATTNBENCH_CTX=${ATTNBENCH_CTX:-32000} DUOSERVE_TEST_ONLY=$bn timeout 240 ncu --clock-control none --kernel-name "regex:${spec#*:}" \
      --launch-skip 2 --launch-count 1 $NCU_SECTIONS --section Occupancy --section LaunchStats $B/duoserve-test-cuda > $L/ncu_$n.txt 2>&1
    echo "== ncu $spec"; grep -E "Duration|Throughput|Pipe|Busy|Stall|Issued|Eligible|Bandwidth|Registers|Shared Memory Config|Achieved Occupancy|Block Limit" $L/ncu_$n.txt | head -40
  done
fi
if has checks; then
  scripts/gpu_check.sh $B checks $L
  grep -E "FAIL" $L/op_test.log | head -20; tail -1 $L/op_test.log
  # stream-K weight streams at every shape, not only the large ones the default picks
  for v in "DUOSERVE_STREAM_K_MIN_UNITS=0"; do
    env $v DUOSERVE_TEST_ONLY=matmul $B/duoserve-test-cuda > $L/op_gemm.log 2>&1
    echo "op test GEMMs [$v]: $(grep FAIL $L/op_gemm.log | head -3) $(tail -1 $L/op_gemm.log)"
  done
  echo "checks done at $((SECONDS-t0)) s"
fi
# (a poll, not wait: the stages run in subshells of their own)
wait_8b() { [ -n "$mk" ] || return 0; for _ in $(seq 1 600); do [ -f $M.ready ] && break; sleep 0.5; done; }
if [ -n "$mk" ]; then wait_8b; tail -1 $L/mk8b.log; echo "8b ready at $((SECONDS-t0)) s"; fi
bg() { timeout 100 $B/bench_gpu $M cuda "$@"; }
if has bench; then
  bg --decode 1,8,64,256 --prefill 2048,32768 > $L/bench.log 2>&1; grep -E "decode|prefill" $L/bench.log | sed -E 's/ +/ /g'
  for x in 1000 4000 32000; do bg --decode 1 --decode-ctx $x --prefill 0 > $L/bench_long.log 2>&1; grep -E "decode" $L/bench_long.log | sed -E 's/ +/ /g'; done
fi
# each GEMM of a layer alone at M = 1..2048 (back to back, 50 calls): us and the weight bandwidth
# (GEMMPROF_AB="name:VAR=v,... ...": again under each set of switches, M = 1 only)
if has gemmprof; then
  BENCH_PROFILE=1 bg --decode 1 --prefill 0 > $L/gemmprof.log 2>&1; grep -E "profile" $L/gemmprof.log | grep -E "M +(1|8|64) " | sed -E 's/ +/ /g'
  for spec in ${GEMMPROF_AB:-}; do
    echo "== gemmprof ${spec%%:*}"
    env $(echo "${spec#*:}" | tr ',' ' ') BENCH_PROFILE=1 timeout 100 $B/bench_gpu $M cuda --decode 1 --prefill 0 > $L/gemmprof_${spec%%:*}.log 2>&1
    grep -E "profile gemm" $L/gemmprof_${spec%%:*}.log | grep -E "M +1 " | sed -E 's/ +/ /g'
  done
fi
# the GEMMs under each choice (GEMMBENCH="name:VAR=v,...|--gemm cublas ..."): each GEMM alone at
# M = 1..2048, then decode b1/64/256/512 and prefill 2k/8k
if has gemmbench; then
  for spec in ${GEMMBENCH:-default: cublas:--gemm,cublas}; do
    name=${spec%%:*}; rest=${spec#*:}; envs=""; args=""
    for kv in $(echo "$rest" | tr ',' ' '); do case $kv in *=*) envs="$envs $kv";; *) args="$args $kv";; esac; done
    env $envs BENCH_PROFILE=1 timeout 150 $B/bench_gpu $M cuda --decode 1 --prefill 0 $args > $L/gemmprof_$name.log 2>&1
    echo "== $name: each GEMM alone"; grep -E "profile gemm" $L/gemmprof_$name.log | grep -E "M +(64|256|2048) " | sed -E 's/ +/ /g'
    env $envs timeout 200 $B/bench_gpu $M cuda --decode 1,64,256,512 --prefill 2048,8192 $args > $L/gemmbench_$name.log 2>&1
    echo "== $name: $(grep -E 'decode|prefill' $L/gemmbench_$name.log | sed -E 's/ +/ /g; s/ context 128//; s/ tokens\/s.*//; s/ms\/step,.*/ms/; s/,.*tokens: */ /' | tr '\n' '|')"
    at "gemmbench $name"
  done
fi
# compile-time variants (scripts/device_pack.sh's VARIANTS: duoserve-test-cuda-NAME, bench_gpu-NAME)
# against the default build, in one run: the GEMM op test (bit-equal across M; not for the default,
# which checks runs), each GEMM alone, and decode b1/64/256/512 and prefill 2k/8k. VARIANT_NAMES
# (default: every variant packed) picks them; "cublas" among them: the default build's --gemm cublas
if has variants; then
  wait_8b
  names=${VARIANT_NAMES:-default $(ls $B | sed -n 's/^duoserve-test-cuda-//p' | grep -vxE 'clk|sampling' | tr '\n' ' ') cublas}
  for name in $names; do
    sfx=-$name; args=; [ $name = default ] && sfx=; [ $name = cublas ] && sfx= && args="--gemm cublas"
    if [ -n "$sfx" ]; then
      timeout 300 env DUOSERVE_TEST_ONLY=matmul $B/duoserve-test-cuda$sfx > $L/op_gemm_$name.log 2>&1
      echo "== $name: op test GEMMs: $(grep -c FAIL $L/op_gemm_$name.log) FAIL lines; $(tail -1 $L/op_gemm_$name.log)"
      grep FAIL $L/op_gemm_$name.log | head -5
    fi
    if [ $name != cublas ]; then
      timeout 300 env DUOSERVE_TEST_ONLY=gemmbench $B/duoserve-test-cuda$sfx > $L/gemmab_$name.log 2>&1
      echo "== $name: each GEMM alone"; grep -E " (256|2048|8192) " $L/gemmab_$name.log | sed -E 's/ +/ /g' | head -24
    fi
    timeout 200 $B/bench_gpu$sfx $M cuda --decode 1,64,256,512 --prefill 2048,8192 $args > $L/vbench_$name.log 2>&1
    echo "== $name: $(grep -E 'decode|prefill' $L/vbench_$name.log | sed -E 's/ +/ /g; s/ context 128//; s/ tokens\/s.*//; s/ms\/step,.*/ms/; s/,.*tokens: */ /' | tr '\n' '|')"
    at "variant $name"
  done
fi
# the flash kernel's phase stamps in real decode steps (bench_gpu-clk, an FA_CLOCKS build): b1 at
# context 128 and 1000, then b1 again under each of STAMP_AB="name:VAR=v,..."
if has stamps && [ -x $B/bench_gpu-clk ]; then
  for spec in "default:" ${STAMP_AB:-}; do
    for x in 128 1000; do
      echo "== stamps ${spec%%:*} ctx $x"
      env $(echo "${spec#*:}" | tr ',' ' ') timeout 100 $B/bench_gpu-clk $M cuda --decode 1 --decode-ctx $x --prefill 0 2>&1 | grep -E "decode|flash" | sed -E 's/ +/ /g'
    done
  done
fi
ab() { local name=$1; shift; env "$@" timeout 100 $B/bench_gpu $M cuda ${AB_ARGS:---decode 1,8,64 --prefill 2048} > $L/ab_$name.log 2>&1; echo "== $name: $(grep -E 'decode|prefill' $L/ab_$name.log | sed -E 's/ +/ /g; s/ context 128//; s/ tokens\/s.*//; s/ms\/step,/ms/' | tr '\n' '|')"; }
# A/B: AB="name:VAR=v,VAR2=v name2:VAR=v" (default: the decode norms without PDL, docs/TUNING.md),
# decode and prefill 2k (AB_ARGS: other bench_gpu arguments, e.g. "--decode 1,1,1 --prefill 0" for
# three b1 figures a run)
if has ab; then
  for spec in ${AB:-norm_pdl0:DUOSERVE_NORM_PDL=0}; do
    ab "${spec%%:*}" $(echo "${spec#*:}" | tr ',' ' ')
  done
fi
# issue 22: decode at long contexts, one bench_gpu load each: full attention at b1 x 128 (no
# regression), b1 x 131,072 and b8 x 98,304 (b8 x 131,072 needs 128 GiB of KV cache, more than the
# card holds beside the weights), then the published pattern at duo 0.5: b1 x 131,072 and b1 x
# 1,048,576. Contexts are made without a prefill (--skip-prefill); LONGDEC_STEPS timed steps a run
# (default 16). Each figure printed as it comes. LONGDEC_FULL / LONGDEC_DUO (--runs lists) override
# the two loads' runs (an 80 GB card gets "1x128,1x131072,4x98304" and "1x131072,1x524288");
# LONGDEC_AB="name:VAR=v,... ..." runs both loads again under each set of switches, LONGDEC_VARIANTS="name ..."
# in each compile-time variant (device_pack.sh's VARIANTS).
if has longdec; then
  wait_8b
  P8=.device/llama3_8b_pattern.tsv
  if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ]; then # an 80 GB card
    LONGDEC_FULL=${LONGDEC_FULL:-1x128,1x131072,4x98304} LONGDEC_DUO=${LONGDEC_DUO:-1x131072,1x524288}
  fi
  ldec() { local name=$1; shift; echo "== longdec $name"
    timeout 170 env "$@" --skip-prefill --prefill 0 --steps ${LONGDEC_STEPS:-16} 2>&1 | tee $L/longdec_$name.log \
      | grep --line-buffered -E "^load:|decode batch|KV cache|bench_gpu:|error" | sed -u -E 's/ +/ /g' | cut -c1-220; }
  # ldec2 NAME BINARY [VAR=v | --flag value ...]: both loads with that binary, under those switches
  # and bench_gpu flags (e.g. LONGDEC_AB="fp8:--kv-cache-dtype,fp8")
  ldec2() { local name=$1 bin=$2 envs= args=; shift 2
    for x in "$@"; do case $x in *=*) envs="$envs $x";; *) args="$args $x";; esac; done
    ldec ${name}_full $envs $bin $M cuda $args --runs ${LONGDEC_FULL:-1x128,1x131072,8x98304}
    ldec ${name}_duo $envs $bin $M cuda $args --runs ${LONGDEC_DUO:-1x131072,1x1048576} --duo-pattern $P8 --duo-sparsity 0.5
    at "longdec $name"; }
  for spec in "default:" ${LONGDEC_AB:-}; do ldec2 ${spec%%:*} $B/bench_gpu $(echo "${spec#*:}" | tr ',' ' '); done
  for v in ${LONGDEC_VARIANTS:-}; do ldec2 v_$v $B/bench_gpu-$v; done # (device_pack.sh's bench_gpu-NAME)
fi
# kernel traces: every kernel of the decode graphs (scripts/ktrace.c), reported per kernel
ktr() { local name=$1; shift; CUDA_INJECTION64_PATH=$B/libktrace.so KTRACE_OUT=$L/kt_$name.txt timeout 100 $B/bench_gpu $M cuda --prefill 0 "$@" > $L/kt_$name.log 2>&1
  grep decode $L/kt_$name.log | sed -E 's/ +/ /g'; python3 scripts/ktrace_report.py $L/kt_$name.txt --top 14 > $L/kt_$name.report 2>&1; head -40 $L/kt_$name.report; xz -T4 $L/kt_$name.txt; }
if has trace; then
  # TRACE_RUNS (default "b1 b1_ctx1000 b64"; also b256, and b1_ctx131072, made without a prefill): which base traces to take
  has_t() { [[ " ${TRACE_RUNS:-b1 b1_ctx1000 b64} " == *" $1 "* ]]; }
  has_t b1 && ktr b1 --decode 1
  has_t b1_ctx1000 && ktr b1_ctx1000 --decode 1 --decode-ctx 1000
  has_t b64 && ktr b64 --decode 64
  has_t b256 && ktr b256 --decode 256
  has_t b1_ctx131072 && ktr b1_ctx131072 --decode 1 --decode-ctx 131072 --skip-prefill
  # TRACE_AB="name:VAR=v,... ..." (optional): the b1 trace again under each set of switches
  for spec in ${TRACE_AB:-}; do
    ( export $(echo "${spec#*:}" | tr ',' ' '); echo "== trace ${spec%%:*}"; ktr "b1_${spec%%:*}" --decode 1 )
  done
fi
if has optime; then
  DUOSERVE_OP_TIMING=1 bg --decode 1 --prefill 0 > $L/optime.log 2>&1
  sed -n '/op timing/,$p' $L/optime.log | head -16
fi
echo "bench done at $((SECONDS-t0)) s"
if has serving; then
  $B/duoserve serve -m $M --device cuda --port 18431 --max-num-seqs 64 > $L/server.log 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do curl -sf http://127.0.0.1:18431/health >/dev/null 2>&1 && break; sleep 0.5; done
  timeout -s INT 100 python3 scripts/bench_serving.py --base-url http://127.0.0.1:18431 --dataset $SHARED/traces/ShareGPT_V3_filtered_1000_prompts_only.json --output-lens-csv $SHARED/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv --ignore-eos --max-concurrency 64 --num-prompts 300 --server-tokenize > $L/serving.log 2>&1
  kill -TERM $pid; wait $pid
  grep -iE "throughput|ttft|tpot|success|fail" $L/serving.log | head -12
fi
# issue 20's trace: the ShareGPT prompts, 900 sent at once, ignore_eos, the server's default flags.
# SHAREGPT_RUNS="name:gemm:VAR=v,...:--arg,v,...[:variant[:--server-flag,v,...]] ..." (default "invariant:invariant::"):
# one server each, with those environment variables and extra bench_serving arguments (and a packed variant's
# duoserve-NAME, and server flags) (e.g. "st10:invariant::--structured-fraction,0.1", "tp1:invariant:DUOSERVE_TP_GROUP=1:"
# or "fp8:invariant::::--kv-cache-dtype,fp8")
if has sharegpt; then
  wait_8b
  for spec in ${SHAREGPT_RUNS:-invariant:invariant::}; do
    IFS=: read -r name gm envs extra bin sflags <<< "$spec"
    env $(echo "$envs" | tr ',' ' ') $B/duoserve${bin:+-$bin} serve -m $M --device cuda --port 18432 --gemm $gm \
      $(echo "$sflags" | tr ',' ' ') > $L/server_sg_$name.log 2>&1 &
    pid=$!; ts=$SECONDS
    for _ in $(seq 1 600); do curl -sf http://127.0.0.1:18432/health >/dev/null 2>&1 && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
    echo "== sharegpt $name: ready after $((SECONDS-ts)) s"; grep -iE "warm-up|KV cache|sequences" $L/server_sg_$name.log | head -4 | cut -c1-300
    timeout -s INT 300 python3 scripts/bench_serving.py --base-url http://127.0.0.1:18432 --dataset $SHARED/traces/ShareGPT_V3_filtered_1000_prompts_only.json \
      --output-lens-csv $SHARED/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv --ignore-eos --num-prompts 900 --server-tokenize \
      --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 $(echo "$extra" | tr ',' ' ') > $L/sharegpt_$name.log 2>&1
    kill -TERM $pid; wait $pid
    grep -iE "throughput|ttft|tpot|success|fail|duration|structured" $L/sharegpt_$name.log | head -20
    at "sharegpt $name"
  done
fi
# issue 25's multi-turn replay: each conversation of sharegpt_test_8conv.json as a chat session, with
# the prefix cache on and off: the plain replay (ShareGPT's turns are short: histories of up to
# ~1.5k tokens), the same opened by a document of ~3,000 tokens a conversation
# (--multi-turn-context-len, a long system prompt or pasted document: the cache's case), and the
# plain replay with the published Llama-3-8B head pattern at duo 0.5.
# MULTITURN_RUNS="name:server flag,value,...[:bench_serving flag,value,...] ..." overrides.
if has multiturn; then
  wait_8b
  P8=.device/llama3_8b_pattern.tsv
  C3=--multi-turn-context-len,3000
  for spec in ${MULTITURN_RUNS:-on: off:--no-enable-prefix-caching doc3k_on::$C3 doc3k_off:--no-enable-prefix-caching:$C3 duo_on:--duo-pattern,$P8,--duo-sparsity,0.5 duo_off:--duo-pattern,$P8,--duo-sparsity,0.5,--no-enable-prefix-caching}; do
    IFS=: read -r name flags bflags <<< "$spec"
    $B/duoserve serve -m $M --device cuda --port 18433 $(echo "$flags" | tr ',' ' ') > $L/server_mt_$name.log 2>&1 &
    pid=$!; ts=$SECONDS
    for _ in $(seq 1 600); do curl -sf http://127.0.0.1:18433/health >/dev/null 2>&1 && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
    echo "== multiturn $name: ready after $((SECONDS-ts)) s"; grep -iE "KV cache" $L/server_mt_$name.log | head -1 | cut -c1-300
    timeout -s INT 200 python3 scripts/bench_serving.py --base-url http://127.0.0.1:18433 --multi-turn \
      --dataset $SHARED/traces/sharegpt_test_8conv.json --server-tokenize --max-prompt-len 7000 --max-total-len 8192 \
      --max-concurrency 8 --percentile-metrics ttft,tpot,e2el --metric-percentiles 50,99 --quiet \
      --result-json $L/multiturn_$name.json $(echo "$bflags" | tr ',' ' ') > $L/multiturn_$name.log 2>&1
    kill -TERM $pid; wait $pid
    grep -iE "turns|ttft|hit rate|throughput|duration|context|error" $L/multiturn_$name.log | head -30
    at "multiturn $name"
  done
fi
# issue 21's long prompts: TTFT of 65,536 and 131,072-token prompts alone, and of 131,072 beside a
# streaming request with that stream's inter-token latency during the prefill (scripts/bench_long.py),
# full attention and the published Llama-3-8B head pattern at duo 0.5, the server's default flags
# otherwise. --max-model-len 262,144, past the checkpoint's max_position_embeddings (131,072; the
# llama3 RoPE scaling does not read it) with DUOSERVE_ALLOW_LONG_MAX_MODEL_LEN=1, so that a
# 131,072-token prompt and its answer fit. LONG_ALONE / LONG_BESIDE (sizes, comma-separated; - for none) and LONG_RUNS
# ("name:flag,value,...[:alone sizes, - for none[:suffix of the duoserve binary]] ...") override; e.g. LONG_RUNS="b3k:--step-cost-budget,3072:-"
# measures only the ITL check under a larger step budget. LONG_HOLD=N:L:M adds bench_long's --hold (N
# prompts of L tokens at once, M tokens each: a KV pool proven, issue 24), LONG_TIMEOUT (200 s) bounds
# each server's measurements, e.g. LONG_RUNS="fp8duo:--kv-cache-dtype,fp8,--duo-pattern,.device/llama3_8b_pattern.tsv,--duo-sparsity,0.5:-"
# LONG_BESIDE=- LONG_HOLD=96:32768:512 LONG_TIMEOUT=400.
if has longprefill; then
  wait_8b
  P8=.device/llama3_8b_pattern.tsv
  for spec in ${LONG_RUNS:-full: duo:--duo-pattern,$P8,--duo-sparsity,0.5}; do
    IFS=: read -r name flags alone sfx <<< "$spec"
    alone=${alone:-${LONG_ALONE:-65536,131072}}; [ "$alone" = - ] && alone= || alone="--alone $alone"
    DUOSERVE_ALLOW_LONG_MAX_MODEL_LEN=1 $B/duoserve${sfx:-} serve -m $M --max-model-len 262144 --device cuda --port 18434 \
      $(echo "$flags" | tr ',' ' ') > $L/server_long_$name.log 2>&1 &
    pid=$!; ts=$SECONDS
    for _ in $(seq 1 300); do curl -sf http://127.0.0.1:18434/health >/dev/null 2>&1 && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
    echo "== longprefill $name: ready after $((SECONDS-ts)) s"; grep -E "step cost|KV cache:" $L/server_long_$name.log | cut -c1-400
    beside=${LONG_BESIDE:-131072}; [ "$beside" = - ] && beside= || beside="--beside $beside"
    T=${LONG_TIMEOUT:-200}
    timeout -s INT $T python3 scripts/bench_long.py --base-url http://127.0.0.1:18434 $alone $beside \
      ${LONG_HOLD:+--hold $LONG_HOLD} --stream-max-tokens 16384 --timeout $((T - 50)) --max-duration $((T - 10)) \
      --result-json $L/long_$name.json > $L/long_$name.log 2>&1
    cat $L/long_$name.log
    kill -TERM $pid; timeout 60 tail --pid=$pid -f /dev/null; kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
    at "longprefill $name"
  done
fi
# tensor parallelism: the usual checks through the NCCL path on one GPU (DUOSERVE_TP_GROUP=1: a
# communicator of one and gathered logits, the same bits as without them), then for each rank
# count of TP_SIZES (default "2 4 8", those the GPUs allow): stories260k's greedy ids and the HF
# parity fixtures (bf16 tolerance), and bench_gpu on dummy weights of TP_MODEL's config.json
# (default: Llama-3.1-70B's shapes, no checkpoint needed)
if has tp; then
  ngpu=$(nvidia-smi -L | wc -l)
  echo "== tp: NCCL path with one GPU"
  DUOSERVE_TP_GROUP=1 scripts/gpu_check.sh $B checks $L/tp1 2>&1 | grep -E "^(ok|FAIL)"
  at "tp checks"
  TM=${TP_MODEL:-/tmp/llama70b}
  if [ ! -f $TM/config.json ]; then
    mkdir -p $TM
    cat > $TM/config.json <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
 "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
 "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}, "tie_word_embeddings": false}
JSON
  fi
  g1=$($B/duoserve generate -m $SHARED/models/stories260k --device cuda --prompt-ids 1 -n 199 --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['ids'])")
  for n in ${TP_SIZES:-2 4 8}; do
    [ "$n" -le "$ngpu" ] || { echo "== tp $n: skipped ($ngpu GPUs)"; continue; }
    gn=$($B/duoserve generate -m $SHARED/models/stories260k --device cuda -tp $n --prompt-ids 1 -n 199 --json 2>$L/tp${n}_gen.log | python3 -c "import json,sys; print(json.load(sys.stdin)['ids'])")
    echo "== tp $n: stories260k greedy ids $([ -n "$gn" ] && [ "$gn" = "$g1" ] && echo 'equal one GPU' || echo "DIFFER: $(tail -2 $L/tp${n}_gen.log)")"
    python3 scripts/check_parity.py --bin $B/duoserve --device cuda --tol 0.05 --tp $n > $L/tp${n}_parity.log 2>&1; tail -1 $L/tp${n}_parity.log
    timeout 500 $B/bench_gpu $TM cuda --tp $n --load-format dummy --decode 1,64,256 --prefill 2048 > $L/tp${n}_bench.log 2>&1
    grep -E "KV cache|load:|decode|prefill" $L/tp${n}_bench.log | sed -E 's/ +/ /g' | cut -c1-240
  done
fi
echo "all done at $((SECONDS-t0)) s"
