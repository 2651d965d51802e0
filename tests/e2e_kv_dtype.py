#!/usr/bin/env python3
"""End-to-end tests of `--kv-cache-dtype` (Python standard library only), on stories260k.

`serve --kv-cache-dtype fp8` serves completions; its startup log and /metrics say fp8_e4m3
(cache_config_info's cache_dtype) and it holds at least 4x the tokens of the default (f32 on the
CPU) in the same --kv-cache-memory, a quarter of the bytes a token; `generate` takes fp8_e4m3 and
bf16 too; a value that is not auto, bf16, bfloat16, fp8 or fp8_e4m3 is a usage error (exit 2);
with --device cuda, fp8 generates (without a usable GPU the device itself is refused). Every loop is bounded in count and time.
Prints one closing line "N passed, M failed"; exits 1 if anything failed.

usage: tests/e2e_kv_dtype.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server  # noqa: E402
from e2e_server import Server, check  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kv_line(lines):
    """(dtype, tokens, bytes a token) of the startup log's KV cache line, or None."""
    for line in lines:
        m = re.search(r"KV cache: (\w+), full pool \d+ blocks x \d+ tokens = (\d+) tokens \((\d+) B/token\)", line)
        if m:
            return m.group(1), int(m.group(2)), int(m.group(3))
    return None


def cache_labels(srv):
    """cache_config_info's labels and kv_cache_capacity_tokens from /metrics."""
    _, data, _ = srv.get("/metrics")
    text = data.decode()
    m = re.search(r"^duoserve:cache_config_info\{([^}]*)\} 1$", text, re.M)
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) if m else {}
    c = re.search(r"^duoserve:kv_cache_capacity_tokens\{[^}]*\} (\d+)$", text, re.M)
    return labels, int(c.group(1)) if c else None


def test_serve_fp8(binary, model):
    servers = {}
    try:
        for dt in ("auto", "fp8"):
            servers[dt] = Server(binary, model, "--kv-cache-dtype", dt, "--kv-cache-memory", "64MiB")
        f32, fp8 = kv_line(servers["auto"].lines), kv_line(servers["fp8"].lines)
        check("startup log: the KV cache line names the dtype (float32 by default, fp8_e4m3 with fp8)",
              f32 and fp8 and f32[0] == "float32" and fp8[0] == "fp8_e4m3", (f32, fp8))
        check("startup log: fp8 takes a quarter of the bytes a token, so 4x the tokens",
              f32 and fp8 and fp8[2] * 4 == f32[2] and fp8[1] >= 4 * f32[1], (f32, fp8))
        lab32, cap32 = cache_labels(servers["auto"])
        lab8, cap8 = cache_labels(servers["fp8"])
        check("/metrics: cache_config_info cache_dtype is fp8_e4m3 (float32 by default)",
              lab8.get("cache_dtype") == "fp8_e4m3" and lab32.get("cache_dtype") == "float32", (lab8, lab32))
        check("/metrics: kv_cache_capacity_tokens is the log's, 4x f32's",
              cap8 is not None and fp8 and cap8 == fp8[1] and cap32 and cap8 >= 4 * cap32, (cap8, cap32, fp8))
        body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        st, data, _ = servers["fp8"].post("/v1/completions", body)
        out = json.loads(data) if st == 200 else {}
        text = out.get("choices", [{}])[0].get("text", "")
        check("fp8: a completion is served (24 tokens of text)",
              st == 200 and out.get("usage", {}).get("completion_tokens") == 24 and len(text) > 10, (st, data[:300]))
        st, data, _ = servers["fp8"].post("/v1/completions", dict(body, stream=False))
        check("fp8: the same greedy request again gives the same text (prefix cache hit included)",
              st == 200 and json.loads(data)["choices"][0]["text"] == text, data[:300])
    finally:
        for srv in servers.values():
            check(f"server {srv.args[-3]}: exits 0 on SIGTERM", srv.stop() == 0)


def run(binary, *args, timeout=60):
    r = subprocess.run([binary, *args], capture_output=True, timeout=timeout)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def test_values(binary, model):
    gen = ["generate", "-m", model, "--prompt-ids", "1", "-n", "8", "--ignore-eos", "--device", "cpu"]
    for v, name in (("fp8_e4m3", "fp8_e4m3"), ("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("auto", "float32")):
        rc, out, err = run(binary, *gen, "--kv-cache-dtype", v)
        check(f"generate --kv-cache-dtype {v}: exit 0, the log says {name}",
              rc == 0 and f"KV cache: {name}," in err and out.strip(), (rc, err[-400:]))
    for cmd in (gen, ["serve", "-m", model, "--port", "0"]):
        rc, _, err = run(binary, *cmd, "--kv-cache-dtype", "fp16", timeout=20)
        check(f"{cmd[0]} --kv-cache-dtype fp16: usage error (exit 2) naming the flag and the choices",
              rc == 2 and "--kv-cache-dtype" in err and "fp8_e4m3" in err and "listening" not in err, (rc, err))


def test_device_cuda(binary, model):
    version = run(binary, "--version", timeout=10)[1]
    gen = ["generate", "-m", model, "--prompt-ids", "1", "-n", "8", "--ignore-eos", "--device", "cuda",
           "--kv-cache-dtype", "fp8"]
    try:
        rc, out, err = run(binary, *gen, timeout=120)
    except subprocess.TimeoutExpired:
        check("generate --device cuda --kv-cache-dtype fp8: ends within 120 s", False, "it kept running")
        return
    if "CUDA: no" in version:
        check("--device cuda --kv-cache-dtype fp8, CPU-only build: exit 1 (no CUDA)",
              rc == 1 and "built without CUDA" in err, (rc, err))
    elif re.search(r"no NVIDIA GPU|NVIDIA driver|compute capability", err):
        check("--device cuda --kv-cache-dtype fp8, no usable GPU: exit 1", rc == 1, (rc, err))
    else:
        check("--device cuda --kv-cache-dtype fp8: exit 0, the log says fp8_e4m3, text generated",
              rc == 0 and "KV cache: fp8_e4m3," in err and len(out.split()) >= 1, (rc, err[-400:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=e2e_server.STORIES260K)
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    model = os.path.normpath(args.model)
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"  SKIP: {model} not found")
        print("0 passed, 0 failed")
        return 0
    for name, fn in (("serve_fp8", test_serve_fp8), ("values", test_values), ("device_cuda", test_device_cuda)):
        if args.k in name:
            print(f"== {name}")
            try:
                fn(args.bin, model)
            except Exception:  # noqa: BLE001
                check(f"{name}: ran without an exception", False, traceback.format_exc())
    print(f"{len(e2e_server.PASS)} passed, {len(e2e_server.FAIL)} failed")
    return 1 if e2e_server.FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
