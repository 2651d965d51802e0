#!/usr/bin/env python3
"""End-to-end tests of scripts/bench_serving.py (Python standard library only).

Against a scripted SSE server on loopback whose timings are known: TTFT, TPOT and E2EL as
vLLM's benchmark defines them, the chat role-only chunk not taken for the first token,
--goodput counting exactly the requests that meet every objective, --percentile-metrics /
--metric-percentiles choosing what is reported. Against `duoserve serve` on
../shared/models/stories260k: vLLM's two-turn ShareGPT format (prompt = the first human turn,
output length = the gpt answer's token count), the prompts-only file with --output-lens-csv,
the openai-chat backend, and the totals matching the server's /metrics. Bad flags exit 2 with
a message. Every run is bounded (--max-duration, subprocess timeouts).

usage: tests/e2e_bench_client.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
"""
import argparse
import http.server
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402
from e2e_server import Server, check  # noqa: E402

ROOT = es.ROOT
BENCH = os.path.join(ROOT, "scripts", "bench_serving.py")
SHARED = es.SHARED


def bench(base_url, *args, timeout=90):
    """Runs bench_serving.py; returns (exit status, stdout, stderr, result JSON or None)."""
    return es.run_script(BENCH, "--base-url", base_url, "--quiet", "--max-duration", "60", "--request-timeout", "30",
                         *args, timeout=timeout)


def write_jsonl(d, name, rows):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def percentile(xs, q):  # numpy's default (linear), as the script's
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ----------------------------------------------------------------------------- scripted server


class Scripted(http.server.BaseHTTPRequestHandler):
    """Streams a completion whose timing the prompt spells: "wait=S gap=S n=N ..." (seconds).
    The stream ends by closing the connection (no length, no chunks), as HTTP/1.1 allows."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        try:
            self.respond()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: its own check reports that

    def respond(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        chat = self.path.endswith("/chat/completions")
        text = body["messages"][0]["content"] if chat else body["prompt"]
        spec = dict(re.findall(r"(\w+)=([\d.]+)", text))
        wait, gap, n = float(spec.get("wait", 0)), float(spec.get("gap", 0)), int(spec.get("n", 4))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

        def send(obj):
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        if chat:  # the role first, before any token (as duoserve does)
            send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        time.sleep(wait)
        for i in range(n):
            if i:
                time.sleep(gap)
            c = {"index": 0, "finish_reason": "length" if i == n - 1 else None}
            c.update({"delta": {"content": "tok "}} if chat else {"text": "tok "})
            send({"choices": [c]})
        send({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": n}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def test_scripted(tmp):
    srv = es.LoopbackHTTPServer(("127.0.0.1", 0), Scripted)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        rows = ([{"prompt": "fast request wait=0 gap=0 n=4", "max_tokens": 4}] * 3
                + [{"prompt": "slow first token wait=0.4 gap=0 n=4", "max_tokens": 4}] * 2
                + [{"prompt": "slow decode steps wait=0 gap=0.1 n=4", "max_tokens": 4}])
        data = write_jsonl(tmp, "scripted.jsonl", rows)
        common = ["--model", "scripted", "--dataset", data, "--no-shuffle", "--save-detailed"]
        for backend in ("openai", "openai-chat"):
            rc, out, err, r = bench(url, *common, "--backend", backend, "--goodput", "ttft:200", "tpot:50",
                                    "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,100")
            ok = rc == 0 and r and r["completed"] == 6
            check(f"scripted {backend}: all six finished", ok, (rc, err[-500:]))
            if not ok:
                continue
            ttfts = sorted(r["ttfts"])
            check(f"scripted {backend}: TTFT is the first token's (the role chunk does not count)",
                  all(t < 0.2 for t in ttfts[:4]) and all(0.4 <= t < 1.5 for t in ttfts[4:]), ttfts)
            # the slow decode's 3 gaps of 0.1 s over 3 steps; (E2EL - TTFT) / tokens would give 0.075.
            # Not 0.1 exactly: a first token read late on a loaded machine shortens E2EL - TTFT
            check(f"scripted {backend}: TPOT = (E2EL - TTFT) / (tokens - 1)",
                  0.09 <= r["p100_tpot_ms"] / 1000 < 0.5 and r["p50_tpot_ms"] < 80,
                  {k: r.get(k) for k in ("p50_tpot_ms", "p100_tpot_ms", "ttfts", "e2els")})
            good = r["request_goodput"] * r["duration"]
            check(f"scripted {backend}: goodput counts the 3 requests meeting ttft:200 tpot:50",
                  abs(good - 3) < 1e-6 and r["goodput_slos_ms"] == {"ttft": 200.0, "tpot": 50.0}, (good, r))
            check(f"scripted {backend}: the goodput line is printed", "Request goodput (req/s):" in out, out)
            check(f"scripted {backend}: only the chosen metrics and percentiles are reported",
                  "P50 TTFT (ms):" in out and "P100 E2EL (ms):" in out and "P99 " not in out and "ITL" not in out
                  and "p50_ttft_ms" in r and "p100_e2el_ms" in r and "mean_itl_ms" not in r and "p99_ttft_ms" not in r,
                  out)
            check(f"scripted {backend}: P50 E2EL is the median of the detailed latencies",
                  abs(r["p50_e2el_ms"] - percentile(r["e2els"], 50) * 1000) < 1e-6, r)
        rc, out, err, r = bench(url, *common, "--goodput", "e2el:0")
        check("scripted: goodput 0 when no request can meet e2el:0", rc == 0 and r and r["request_goodput"] == 0,
              (rc, err[-300:]))
        rc, out, err, r = bench(url, *common)
        check("scripted: no goodput line and a null request_goodput without --goodput",
              rc == 0 and r and r["request_goodput"] is None and "goodput" not in out
              and "P99 TTFT (ms):" in out and "E2EL" not in out, out)
    finally:
        srv.shutdown()
        srv.server_close()


def test_bad_flags(tmp):
    data = write_jsonl(tmp, "x.jsonl", [{"prompt": "hello there, world", "max_tokens": 4}])
    for flags, want in ((["--goodput", "ttft=5"], "KEY:VALUE"), (["--goodput", "ttfb:5"], "one of ttft, tpot, e2el"),
                        (["--goodput", "ttft:-1"], "non-negative"),
                        (["--percentile-metrics", "ttft,foo"], "unknown 'foo'"),
                        (["--metric-percentiles", "50,x"], "comma-separated numbers"),
                        (["--metric-percentiles", "101"], "[0, 100]"),
                        (["--backend", "openai-chat", "--endpoint", "/v1/completions"], "chat/completions")):
        rc, out, err, _ = bench("http://127.0.0.1:9", "--model", "m", "--dataset", data, *flags, timeout=30)
        check(f"bad flags {' '.join(flags)}: exit 2 with a message", rc == 2 and want in err, (rc, err[-300:]))


# ----------------------------------------------------------------------------- duoserve


def metric_sums(srv):
    m = srv.metrics()
    return {k: m.get("duoserve:" + k, 0) for k in ("request_prompt_tokens_sum", "request_generation_tokens_sum",
                                                  "request_generation_tokens_count")}


def test_sharegpt_two_turn(srv, tmp):
    """vLLM's ShareGPT format: the first human turn is the prompt, its gpt answer gives the length."""
    convs = [{"id": "a", "conversations": [{"from": "human", "value": "Once upon a time there was a cat."},
                                           {"from": "gpt", "value": "The cat liked to play in the sun all day."}]},
             {"id": "b", "conversations": [{"from": "human", "value": "Tell me about the little red bird."},
                                           {"from": "gpt", "value": "The bird sang a song."},
                                           {"from": "human", "value": "And then what happened next?"},
                                           {"from": "gpt", "value": "It flew away over the big green hill."}]},
             {"id": "c", "conversations": [{"from": "human", "value": "A question with no answer at all here"}]},
             {"id": "d", "conversations": [{"from": "human", "value": "Lily went to the park with her mom."},
                                           {"from": "gpt", "value": "They saw a dog."}]}]
    path = os.path.join(tmp, "sharegpt.json")
    json.dump(convs, open(path, "w"))

    def count(text):
        return json.loads(srv.post("/tokenize", {"prompt": text})[1])["count"]

    want = sorted((count(c["conversations"][0]["value"]), count(c["conversations"][1]["value"]))
                  for c in convs if len(c["conversations"]) > 1)
    before = metric_sums(srv)
    url = f"http://127.0.0.1:{srv.port}"
    rc, out, err, r = bench(url, "--dataset", path, "--server-tokenize", "--ignore-eos", "--save-detailed",
                            "--max-total-len", "512")
    got = sorted(zip(r["input_lens"], r["requested_output_lens"])) if r else None
    check("sharegpt two-turn: the three answered conversations, prompt = first human turn, "
          "length = its gpt answer's tokens", rc == 0 and got == want, (rc, got, want, err[-500:]))
    check("sharegpt two-turn: outputs as long as asked (ignore_eos)",
          r and r["output_lens"] == r["requested_output_lens"], r and r["output_lens"])
    after = metric_sums(srv)
    check("sharegpt two-turn: totals equal the server's request_* histogram sums",
          r and after["request_prompt_tokens_sum"] - before["request_prompt_tokens_sum"] == r["total_input_tokens"]
          and after["request_generation_tokens_sum"] - before["request_generation_tokens_sum"]
          == r["total_output_tokens"]
          and after["request_generation_tokens_count"] - before["request_generation_tokens_count"] == r["completed"],
          (before, after, r and (r["total_input_tokens"], r["total_output_tokens"])))
    real = os.path.join(SHARED, "traces", "sharegpt_test_8conv.json")
    if os.path.exists(real):
        rc, out, err, r = bench(url, "--dataset", real, "--server-tokenize", "--ignore-eos", "--max-total-len", "512",
                                "--num-prompts", "8")
        check("sharegpt two-turn: the real multi-turn trace runs (what fits 512 tokens)",
              rc == 0 and r and r["completed"] >= 1 and r["failed"] == 0, (rc, err[-500:]))


def test_prompts_only(srv, tmp):
    trace = os.path.join(SHARED, "traces", "ShareGPT_V3_filtered_1000_prompts_only.json")
    csv_path = os.path.join(SHARED, "traces", "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
    if not (os.path.exists(trace) and os.path.exists(csv_path)):
        check("prompts-only: traces present (skipped)", True)
        return
    url = f"http://127.0.0.1:{srv.port}"
    rc, out, err, r = bench(url, "--dataset", trace, "--output-lens-csv", csv_path, "--server-tokenize",
                            "--ignore-eos", "--num-prompts", "5", "--max-total-len", "512", "--save-detailed")
    check("prompts-only: five requests with the CSV's output lengths",
          rc == 0 and r and r["completed"] == 5 and r["output_lens"] == r["requested_output_lens"], (rc, err[-500:]))
    rc, out, err, r = bench(url, "--dataset", trace, "--num-prompts", "2")
    check("prompts-only: without an output length source, a clear error",
          rc != 0 and "--output-lens-csv" in err, (rc, err[-300:]))


def test_chat(srv, tmp):
    rows = [{"prompt": f"Once upon a time, a little {w} went to the park.", "max_tokens": m}
            for w, m in (("girl", 6), ("dog", 9), ("bird", 12), ("boy", 5))]
    data = write_jsonl(tmp, "chat.jsonl", rows)
    before = metric_sums(srv)
    rc, out, err, r = bench(f"http://127.0.0.1:{srv.port}", "--backend", "openai-chat", "--dataset", data,
                            "--ignore-eos", "--save-detailed", "--percentile-metrics", "ttft,tpot,itl,e2el")
    after = metric_sums(srv)
    ok = rc == 0 and r and r["completed"] == 4 and r["backend"] == "openai-chat"
    check("chat: four streamed chat completions", ok, (rc, err[-500:], out[-500:]))
    if not ok:
        return
    check("chat: usage completion_tokens = max_completion_tokens (ignore_eos)",
          sorted(r["output_lens"]) == [5, 6, 9, 12] and r["output_lens"] == r["requested_output_lens"],
          r["output_lens"])
    check("chat: text came back and TTFT < E2EL", all(r["generated_texts"])
          and all(0 < t < e for t, e in zip(r["ttfts"], r["e2els"])), r)
    check("chat: the server's chat path counted the tokens",
          after["request_generation_tokens_sum"] - before["request_generation_tokens_sum"] == 32, (before, after))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=es.STORIES260K)
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    model = os.path.normpath(args.model)
    srv = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, fn in (("scripted", test_scripted), ("bad_flags", test_bad_flags)):
                if args.k in name:
                    print(f"== {name}")
                    try:
                        fn(tmp)
                    except Exception:  # noqa: BLE001
                        check(f"{name}: ran without an exception", False, traceback.format_exc())
            served = [("sharegpt_two_turn", test_sharegpt_two_turn), ("prompts_only", test_prompts_only),
                      ("chat", test_chat)]
            if any(args.k in n for n, _ in served) and not os.path.exists(os.path.join(model, "config.json")):
                print(f"  SKIP: {model} not found")
            elif any(args.k in n for n, _ in served):
                tmpl = os.path.join(tmp, "chat.jinja")
                with open(tmpl, "w") as f:
                    f.write("{% for m in messages %}{{ m['content'] }}{% endfor %}")
                srv = Server(args.bin, model, "--chat-template", tmpl)
                for name, fn in served:
                    if args.k in name:
                        print(f"== {name}")
                        try:
                            fn(srv, tmp)
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
