#!/usr/bin/env bash
# End-to-end test of scripts/bench_gpu.c on the CPU (stories260k): it loads, prints its decode and
# prefill lines, and no measured prefill takes a block from the prefix cache (its prompts are
# prefixes of one token array: until 4a62722 the cache held the earlier runs' blocks, and prefill
# 8k after 2k measured 6,160 tokens of work). Prints "N passed, M failed".
set -u
BIN=${BUILD:-build}/bench_gpu
SHARED=${DUO_SHARED:-../shared}
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "  ok   $1"; }
bad() { fail=$((fail+1)); echo "  FAIL $1"; }
M=$SHARED/models/stories260k
if [ ! -d "$M" ]; then
  echo "  SKIP bench_gpu: $M not found"; echo "0 passed, 0 failed"; exit 0
fi
out=$(timeout 120 "$BIN" "$M" cpu --decode 1 --steps 4 --prefill 64,128,256 2>&1); rc=$?
[ $rc -eq 0 ] && ok "bench_gpu runs (cpu, stories260k)" || bad "bench_gpu exited $rc: $(echo "$out" | tail -2)"
n=$(echo "$out" | grep -cE '^decode batch +1, context +128: ')
[ "$n" = 1 ] && ok "one decode line" || bad "decode lines: $n"
for L in 64 128 256; do
  line=$(echo "$out" | grep -E "^prefill +$L tokens: ")
  case "$line" in
    *"(0 from the prefix cache)") ok "prefill $L: no prompt token from the prefix cache" ;;
    *) bad "prefill $L: '$line'" ;;
  esac
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
