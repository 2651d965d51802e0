#!/usr/bin/env bash
# Runs every test binary given as arguments, then the end-to-end scripts (tests/e2e_*.sh).
# Prints one closing line "N passed, M failed" and exits non-zero if anything failed.
set -u
pass=0; fail=0; failed=()
for t in "$@"; do
  echo "=== $t"
  if "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
done
for t in tests/e2e_*.sh; do
  [ -e "$t" ] || continue
  echo "=== $t"
  if BUILD="${BUILD:-build}" bash "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
done
echo
[ $fail -eq 0 ] || echo "failed: ${failed[*]}"
echo "test suites: $pass passed, $fail failed"
[ $fail -eq 0 ]
