#!/usr/bin/env bash
# Installs the Debian packages duoserve needs to build and test. Idempotent: packages already
# present are not fetched again. Runs as root, or through sudo when not root.
set -euo pipefail

pkgs=(
  build-essential pkg-config          # compiler, make
  libuv1-dev                          # event loops: HTTP server and engine
  libcjson-dev                        # JSON (config.json, requests)
  libpcre2-dev libutf8proc-dev        # tokenizer: Unicode regex pre-tokenizers, NFC
  libcmocka-dev                       # unit tests
  python3 curl                        # end-to-end tests and benchmark scripts
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
