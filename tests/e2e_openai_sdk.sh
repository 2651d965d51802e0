#!/usr/bin/env bash
# End-to-end test of duoserve with the official OpenAI Node SDK (tests/node/openai_sdk.test.mjs):
# models.list, completions and chat completions (plain and streamed), and the SDK's error
# classes on 400/401/404. Needs node (>= 18) and npm; installs the pinned `openai` package into
# tests/node/node_modules (quick when already there). Without node, or when npm cannot install
# (no registry), it prints a SKIP line and exits 0. Prints "N passed, M failed".
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${BUILD:-$ROOT/build}/duoserve")
[ -n "${DUO_SHARED:-}" ] && export DUO_SHARED=$(realpath -m "$DUO_SHARED")
cd "$ROOT" || exit 1
NODE_DIR=tests/node

skip() { echo "  SKIP OpenAI Node SDK test: $1"; echo "0 passed, 0 failed"; exit 0; }

command -v node >/dev/null 2>&1 || skip "node not found"
command -v npm >/dev/null 2>&1 || skip "npm not found"
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)
[ "${major:-0}" -ge 18 ] 2>/dev/null || skip "node $(node --version 2>/dev/null) is older than 18"
[ -x "$BIN" ] || { echo "  FAIL $BIN not found (run make first)"; echo "0 passed, 1 failed"; exit 1; }

tmp=$(mktemp -d /tmp/duoserve-node-XXXXXX); trap 'rm -rf "$tmp"' EXIT

# --no-save: never rewrite the committed package.json / package-lock.json during a test run.
# Bounded: a machine without a registry fails here within about a minute, not npm's 5 minutes.
if ! timeout 180 npm install --no-audit --no-fund --no-save --fetch-timeout=30000 --fetch-retries=1 \
       --prefix "$NODE_DIR" >"$tmp/npm.log" 2>&1; then
  want=$(node -p "require('./$NODE_DIR/package.json').dependencies.openai" 2>/dev/null)
  have=$(node -p "require('./$NODE_DIR/node_modules/openai/package.json').version" 2>/dev/null)
  if [ -n "$want" ] && [ "$want" = "$have" ]; then
    echo "  info npm install failed; using the installed openai $have"
  else
    tail -5 "$tmp/npm.log" | sed 's/^/  npm: /'
    skip "npm install failed (no registry?)"
  fi
fi
echo "  info openai $(node -p "require('./$NODE_DIR/node_modules/openai/package.json').version"), node $(node --version)"

# spec to the terminal, TAP to a file for the counts; the whole file is bounded at 3 minutes
# (timeout signals its whole process group, the daemons included).
DUOSERVE_BIN="$BIN" timeout -k 10 180 node --test \
  --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$tmp/tap" \
  "$NODE_DIR/openai_sdk.test.mjs"
rc=$?
count() { sed -n "s/^# $1 \([0-9]*\)$/\1/p" "$tmp/tap" 2>/dev/null | tail -1; }
pass=$(count pass); fail=$(count fail); cancelled=$(count cancelled); skipped=$(count skipped)
pass=${pass:-0}; fail=$(( ${fail:-0} + ${cancelled:-0} ))
[ "${skipped:-0}" -gt 0 ] && echo "  SKIP $skipped test(s) skipped (../shared/models/stories260k not found?)"
if [ $rc -ne 0 ] && [ $fail -eq 0 ]; then
  fail=1; echo "  FAIL node --test exited $rc$([ $rc -eq 124 ] && echo ' (timed out after 180 s)')"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
