#!/usr/bin/env bash
# Runs every test binary given as arguments, the structure check, then the end-to-end scripts (tests/e2e_*.sh, *.py).
# Prints one closing line "N passed, M failed" and exits non-zero if anything failed.
set -u
pass=0; fail=0; failed=()
for t in "$@"; do
  echo "=== $t"
  if "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
  # the engine's cases again with the model split over two tensor-parallel ranks (CPU threads)
  case "$t" in
    */test_engine|*/test_prefix_cache)
      echo "=== $t (DUO_TEST_TP=2)"
      if DUO_TEST_TP=2 "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t (DUO_TEST_TP=2)"); fi ;;
  esac
done
# the structure (issue 23): no call circle between modules, no include that runs back up
echo "=== scripts/check_structure.py"
if python3 scripts/check_structure.py --build "${BUILD:-build}" | tail -4; [ "${PIPESTATUS[0]}" -eq 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("scripts/check_structure.py"); fi
for t in tests/e2e_*.sh tests/e2e_*.py; do
  [ -e "$t" ] || continue
  echo "=== $t"
  case "$t" in
    *.sh) BUILD="${BUILD:-build}" bash "$t" ;;
    *.py) timeout 900 python3 "$t" --bin "${BUILD:-build}/duoserve" ;;
  esac
  if [ $? -eq 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
done
echo
[ $fail -eq 0 ] || echo "failed: ${failed[*]}"
echo "test suites: $pass passed, $fail failed"
[ $fail -eq 0 ]
