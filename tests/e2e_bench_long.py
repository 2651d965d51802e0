#!/usr/bin/env python3
"""End-to-end tests of scripts/bench_long.py (Python standard library only).

Against `duoserve serve` on ../shared/models/stories260k with 16-token steps (so a 256-token
prompt takes at least 16 steps): TTFT alone for three sizes (the server's prompt token counts,
the fit), and beside a stream (the stream outlasts the prefill: at least a gap a step during it,
ordered statistics, the TTFT growth reported), six requests held at once; a stream too short to cover the prefill, ids
outside the vocabulary and bad flags make the script fail as it says. Every run is bounded
(--max-duration, subprocess timeouts); a few seconds in all.

usage: tests/e2e_bench_long.py [--bin build/duoserve] [--model ../shared/models/stories260k]
"""
import argparse
import os
import signal
import sys
import traceback

sys.dont_write_bytecode = True  # importing e2e_server must not leave tests/__pycache__ behind
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402
from e2e_server import Server, check  # noqa: E402

ROOT = es.ROOT
BENCH = os.path.join(ROOT, "scripts", "bench_long.py")


def bench(base_url, *args, timeout=60):
    """Runs bench_long.py; returns (exit status, stdout, stderr, result JSON or None)."""
    return es.run_script(BENCH, "--base-url", base_url, "--max-duration", "30", "--timeout", "20", *args,
                         timeout=timeout)


def ordered(st):
    return st["count"] > 0 and 0 <= st["median"] <= st["p99"] <= st["max"]


def test_alone_and_beside(url):
    rc, out, err, r = bench(url, "--alone", "64,128,256", "--beside", "256", "--stream-max-tokens", "240",
                            "--id-range", "3:500")
    check("runs: exit 0 with a result", rc == 0 and r is not None, out + err)
    if r is None:
        return
    check("alone: one result a size, the server's prompt counts", [x["n"] for x in r["alone"]] == [64, 128, 256] and
          all(x["prompt_tokens"] == x["n"] and 0 < x["ttft_s"] < 20 for x in r["alone"]), r["alone"])
    check("fit: three sizes give all three terms", r["fit"] is not None and r["fit"]["s_fixed"] is not None, r["fit"])
    b = r["beside"][0] if r["beside"] else None
    check("beside: one result, covered by the stream", b is not None and b["n"] == 256 and b["covered"], b)
    if b:
        d = b["itl_during_ms"]
        # 256 tokens in steps of at most 16 tokens, the stream's token in each: 16 steps or more
        check("beside: at least a gap a prefill step, statistics in order", d["count"] >= 15 and ordered(d), d)
        check("beside: the lead and a token a gap counted", b["stream_tokens"] >= 16 + d["count"], b)
        check("beside: TTFT growth reported", "256" in r["ttft_growth"], r["ttft_growth"])
    check("report: the text names both measurements", "alone" in out and "ITL during the prefill" in out, out)
    check("no failures listed", not r["failed"] and not r["skipped"], r)


def test_hold(url):
    # 6 prompts of 150 tokens in 16-token steps: the last one's first token comes after ~57 steps,
    # so 350 tokens each keep the first ones running well past then (/metrics sees all six); 4 do not
    rc, out, err, r = bench(url, "--hold", "6:150:350", "--id-range", "3:500", "--warmup", "0")
    h = r["hold"][0] if r and r["hold"] else None
    check("hold: exit 0, all six answered and held at once", rc == 0 and h is not None and h["concurrent"], out + err)
    if h:
        check("hold: the context held counts every prompt and some tokens",
              6 * 150 + 6 <= h["held_tokens"] <= 6 * 250, h)
        check("hold: /metrics saw the six running", h["peak_running"] == 6, h)
        check("hold: timings in order", 0 < h["all_in_s"] <= h["duration_s"] < 30, h)
    rc, out, err, r = bench(url, "--hold", "6:150:4", "--id-range", "3:500", "--warmup", "0")
    check("hold: requests that end before the last starts: not concurrent, exit 1",
          rc == 1 and r is not None and r["hold"] and not r["hold"][0]["concurrent"], out + err)
    rc, out, err, r = bench(url, "--hold", "2:32:4", "--id-range", "600:700", "--warmup", "0")
    check("hold: a request the server refuses fails the run", rc == 1 and r is not None and r["failed"], out + err)


def test_failures(url):
    rc, out, err, r = bench(url, "--beside", "256", "--stream-max-tokens", "20", "--id-range", "3:500")
    check("a stream shorter than the prefill: not covered, exit 1",
          rc == 1 and r is not None and r["beside"] and not r["beside"][0]["covered"], out + err)
    rc, out, err, r = bench(url, "--alone", "32", "--id-range", "600:700", "--warmup", "0")
    check("ids outside the vocabulary: the server's error, exit 1",
          rc == 1 and r is not None and r["failed"] and "HTTP 400" in r["failed"][0]["error"], out + err)
    for bad in (["--alone", "0"], ["--alone", "x"], [], ["--alone", "8", "--id-range", "5:5"],
                ["--beside", "8", "--stream-lead", "9", "--stream-max-tokens", "9"], ["--hold", "2:8"],
                ["--hold", "0:8:8"]):
        rc, out, err, _ = bench(url, *bad)
        check(f"usage error {bad}: exit 2 with a message", rc == 2 and "error" in err, err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=es.STORIES260K)
    args = ap.parse_args()
    model = os.path.normpath(args.model)
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"  SKIP: {model} not found")
        print("0 passed, 0 failed")
        return 0
    srv = None
    try:
        srv = Server(args.bin, model, "--max-num-batched-tokens", "16")
        url = f"http://127.0.0.1:{srv.port}"
        for name, fn in (("alone_and_beside", test_alone_and_beside), ("hold", test_hold),
                         ("failures", test_failures)):
            print(f"== {name}")
            try:
                fn(url)
            except Exception:  # noqa: BLE001
                check(f"{name}: ran without an exception", False, traceback.format_exc())
        check("server: SIGTERM exits 0", srv.stop() == 0)
    finally:
        if srv:
            srv.stop(signal.SIGKILL)
    print(f"{len(es.PASS)} passed, {len(es.FAIL)} failed")
    return 1 if es.FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
