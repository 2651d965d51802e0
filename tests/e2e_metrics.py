#!/usr/bin/env python3
"""End-to-end tests of GET /metrics (Python standard library only).

Starts `duoserve serve` on ../shared/models/stories260k with two sequences at a time
(--max-num-seqs 2, so concurrent requests queue) and a 32-token KV block, and checks:
  * the whole exposition parses strictly as Prometheus text format 0.0.4: HELP and TYPE for
    every family, each sample in a declared family and its family's samples together, no
    duplicate series, histogram buckets cumulative in increasing `le` ending in +Inf, with
    _sum and _count (= the +Inf bucket);
  * the engine's histograms (vLLM's names) move as the requests say: one queue / prefill /
    decode / inference / prompt-tokens / generation-tokens observation per choice, token sums
    equal to the usage totals (bucket by bucket), time_per_output_token counted once per token
    after a choice's first and summing to the decode time, iteration tokens summing to the
    tokens computed; queue time grows when requests wait for a seat;
  * vLLM's bucket bounds; cache_config_info's labels; process_* against /proc.
Every loop is bounded in count and time. Prints "N passed, M failed"; exits 1 on a failure.

usage: tests/e2e_metrics.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
"""
import argparse
import json
import math
import os
import re
import signal
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402
from e2e_server import Server, check, stream  # noqa: E402

ROOT = es.ROOT
P = "duoserve:"
LATENCY_BOUNDS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                  480.0, 960.0, 1920.0, 7680.0]  # vLLM's request_latency_buckets
VLLM_TPOT_BOUNDS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0]
TTFT_BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0, 160.0, 640.0, 2560.0]
ITERATION_BOUNDS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
ENGINE_HISTS = ["request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
                "request_inference_time_seconds", "request_prompt_tokens", "request_generation_tokens"]

# ----------------------------------------------------------------------------- strict parser

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def parse_labels(s, errs, where):
    """'a="x",b="y\\"z"' -> dict; escapes \\\\, \\" and \\n only."""
    out, i = {}, 0
    while i < len(s):
        m = re.compile(LABEL).match(s, i)
        if not m or s[m.end():m.end() + 2] != '="':
            errs.append(f"{where}: bad label at {s[i:i + 30]!r}")
            return out
        name, i, val = m.group(0), m.end() + 2, []
        while i < len(s) and s[i] != '"':
            if s[i] == "\\":
                nxt = s[i + 1:i + 2]
                if nxt not in ("\\", '"', "n"):
                    errs.append(f"{where}: bad escape \\{nxt} in label {name}")
                val.append("\n" if nxt == "n" else nxt)
                i += 2
            else:
                if s[i] == "\n":
                    errs.append(f"{where}: raw newline in label {name}")
                val.append(s[i])
                i += 1
        if i >= len(s):
            errs.append(f"{where}: unterminated label {name}")
            return out
        i += 1
        if name in out:
            errs.append(f"{where}: duplicate label {name}")
        out[name] = "".join(val)
        if i < len(s):
            if s[i] != ",":
                errs.append(f"{where}: expected ',' after label {name}")
                return out
            i += 1
    return out


def parse_value(v):
    if v in ("+Inf", "Inf"):
        return math.inf
    if v == "-Inf":
        return -math.inf
    if v == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", v):
        raise ValueError(v)
    return float(v)


def family_of(name, fams):
    if name in fams and fams[name]["type"] != "histogram":
        return name
    for suf in ("_bucket", "_sum", "_count"):
        if name.endswith(suf) and fams.get(name[:-len(suf)], {}).get("type") == "histogram":
            return name[:-len(suf)]
    return None


def parse_exposition(text):
    """-> (families {name: {type, help, samples: [(sample name, labels, value)]}}, errors)."""
    errs, fams, order = [], {}, []
    if text and not text.endswith("\n"):
        errs.append("the text does not end with a newline")
    closed, current, seen = set(), None, set()
    for ln, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), 1):
        where = f"line {ln}"
        if line.startswith("#"):
            m = re.fullmatch(rf"# (HELP|TYPE) ({NAME}) (.*)", line) or re.fullmatch(rf"# (HELP|TYPE) ({NAME})()", line)
            if not m:
                errs.append(f"{where}: comment that is neither HELP nor TYPE: {line[:80]!r}")
                continue
            kind, name, rest = m.groups()
            f = fams.setdefault(name, {"type": None, "help": None, "samples": []})
            if name not in order:
                order.append(name)
            if name in closed or (f["samples"] and kind == "TYPE"):
                errs.append(f"{where}: {kind} for {name} after its samples")
            if kind == "HELP":
                if f["help"] is not None:
                    errs.append(f"{where}: second HELP for {name}")
                if re.search(r"\\[^\\n]", rest):
                    errs.append(f"{where}: bad escape in HELP of {name}")
                f["help"] = rest
            else:
                if f["type"] is not None:
                    errs.append(f"{where}: second TYPE for {name}")
                if rest not in TYPES:
                    errs.append(f"{where}: unknown type {rest!r}")
                f["type"] = rest
            if current is not None and current != name:
                closed.add(current)
            current = name
            continue
        if not line.strip():
            errs.append(f"{where}: blank line")
            continue
        m = re.fullmatch(rf"({NAME})(?:\{{(.*)\}})? (\S+)(?: (-?\d+))?", line)
        if not m:
            errs.append(f"{where}: not a sample: {line[:80]!r}")
            continue
        name, lbls, val, _ts = m.groups()
        labels = parse_labels(lbls or "", errs, where)
        try:
            value = parse_value(val)
        except ValueError:
            errs.append(f"{where}: bad value {val!r}")
            continue
        fam = family_of(name, fams)
        if fam is None or fams[fam]["type"] is None:
            errs.append(f"{where}: sample {name} has no declared family (TYPE)")
            continue
        if fam in closed or (current is not None and current != fam):
            errs.append(f"{where}: sample {name} is not with its family's other lines")
        closed.discard(fam)
        current = fam
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            errs.append(f"{where}: duplicate series {name}{labels}")
        seen.add(key)
        t = fams[fam]["type"]
        if t == "counter" and not value >= 0:
            errs.append(f"{where}: counter {name} = {value}")
        if t == "histogram" and name.endswith("_bucket") and "le" not in labels:
            errs.append(f"{where}: bucket without le")
        fams[fam]["samples"].append((name, labels, value))
    for name in order:
        f = fams[name]
        if f["help"] is None or f["type"] is None:
            errs.append(f"family {name}: HELP and TYPE are both required")
        if f["type"] == "histogram":
            check_histogram(name, f["samples"], errs)
    return fams, errs


def check_histogram(name, samples, errs):
    series = {}
    for sname, labels, v in samples:
        key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        s = series.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if sname.endswith("_bucket"):
            try:
                le = parse_value(labels.get("le", ""))
            except ValueError:
                errs.append(f"{name}: bad le {labels.get('le')!r}")
                continue
            s["buckets"].append((le, v))
        elif sname.endswith("_sum"):
            s["sum"] = v
        else:
            s["count"] = v
    for key, s in series.items():
        b = s["buckets"]
        if not b or b[-1][0] != math.inf:
            errs.append(f"{name}{dict(key)}: buckets do not end in +Inf")
        if any(b[i][0] >= b[i + 1][0] for i in range(len(b) - 1)):
            errs.append(f"{name}{dict(key)}: le not strictly increasing")
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            errs.append(f"{name}{dict(key)}: buckets not cumulative")
        if any(v < 0 or v != int(v) for _, v in b):
            errs.append(f"{name}{dict(key)}: a bucket count is not a non-negative integer")
        if s["sum"] is None or s["count"] is None:
            errs.append(f"{name}{dict(key)}: _sum or _count missing")
        elif b and s["count"] != b[-1][1]:
            errs.append(f"{name}{dict(key)}: _count {s['count']} != +Inf bucket {b[-1][1]}")


# ----------------------------------------------------------------------------- helpers


def scrape(srv):
    st, data, headers = srv.get("/metrics")
    fams, errs = parse_exposition(data.decode("utf-8"))
    return st, fams, errs, headers


def hist_of(fams, name):
    """{'buckets': [(le, cumulative)], 'sum', 'count'} of a histogram family's one series."""
    out = {"buckets": [], "sum": 0.0, "count": 0.0}
    for sname, labels, v in fams.get(name, {}).get("samples", []):
        if sname.endswith("_bucket"):
            out["buckets"].append((parse_value(labels["le"]), v))
        elif sname.endswith("_sum"):
            out["sum"] = v
        elif sname.endswith("_count"):
            out["count"] = v
    return out


def value_of(fams, name, **labels):
    for _, lb, v in fams.get(name, {}).get("samples", []):
        if all(lb.get(k) == x for k, x in labels.items()):
            return v
    return None


def delta(after, before, name):
    a, b = hist_of(after, P + name), hist_of(before, P + name)
    bb = dict(b["buckets"])
    return {"buckets": [(le, v - bb.get(le, 0)) for le, v in a["buckets"]], "sum": a["sum"] - b["sum"],
            "count": a["count"] - b["count"]}


def wait_idle(srv, seconds=10):
    """The engine's stats after its last step (running and waiting both 0)."""
    end = time.time() + seconds
    while True:
        st, fams, errs, _ = scrape(srv)
        idle = value_of(fams, P + "num_requests_running") == 0 and value_of(fams, P + "num_requests_waiting") == 0
        if idle or time.time() > end:
            return fams
        time.sleep(0.02)


def bounds_of(h):
    return [le for le, _ in h["buckets"] if le != math.inf]


def buckets_match(h, values):
    """Each cumulative bucket of a delta histogram holds exactly the values <= its bound."""
    return all(v == sum(1 for x in values if x <= le) for le, v in h["buckets"])


def close(a, b, tol=1e-6):
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


# ----------------------------------------------------------------------------- tests


def test_format(srv):
    st, fams, errs, headers = scrape(srv)
    check("format: 200 with the 0.0.4 text content type",
          st == 200 and headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"), (st, headers))
    check("format: the whole exposition parses strictly", not errs, errs[:10])
    want = {P + "request_queue_time_seconds": "histogram", P + "request_prefill_time_seconds": "histogram",
            P + "request_decode_time_seconds": "histogram", P + "request_inference_time_seconds": "histogram",
            P + "time_per_output_token_seconds": "histogram", P + "request_time_per_output_token_seconds": "histogram",
            P + "request_prompt_tokens": "histogram", P + "request_generation_tokens": "histogram",
            P + "iteration_tokens_total": "histogram", P + "time_to_first_token_seconds": "histogram",
            P + "e2e_request_latency_seconds": "histogram", P + "inter_token_latency_seconds": "histogram",
            P + "cache_config_info": "gauge", P + "num_requests_running": "gauge", P + "prompt_tokens_total": "counter",
            "process_resident_memory_bytes": "gauge", "process_virtual_memory_bytes": "gauge",
            "process_cpu_seconds_total": "counter", "process_open_fds": "gauge", "process_max_fds": "gauge",
            "process_start_time_seconds": "gauge"}
    bad = {n: (fams.get(n) or {}).get("type") for n, t in want.items() if (fams.get(n) or {}).get("type") != t}
    check("format: every family vLLM's dashboards read, with its type", not bad, bad)


def run_requests(srv):
    """A mix of requests; returns [(prompt_tokens, completion_tokens)] per choice, and the prompt
    tokens the prefix cache gave (usage.prompt_tokens_details.cached_tokens: not computed)."""
    out, cached = [], 0
    bodies = [{"prompt": [1, 5, 9], "max_tokens": 7},
              {"prompt": "Once upon a time", "max_tokens": 12},
              {"prompt": [1] + list(range(100, 129)), "max_tokens": 5},
              {"prompt": [1, 300, 301, 302, 303, 304], "max_tokens": 1}]
    for b in bodies:
        st, data, _ = srv.post("/v1/completions", {**b, "temperature": 0, "ignore_eos": True})
        u = json.loads(data)["usage"] if st == 200 else {}
        out.append((u.get("prompt_tokens"), u.get("completion_tokens")))
        cached += (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    st, events, done, _ = stream(srv, {"prompt": [1, 7, 7, 7, 7, 7, 7, 7], "max_tokens": 9, "ignore_eos": True,
                                       "stream": True, "stream_options": {"include_usage": True}})
    u = events[-1].get("usage") or {} if events else {}
    out.append((u.get("prompt_tokens"), u.get("completion_tokens")))
    cached += (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return out, cached


def test_histograms(srv):
    before = wait_idle(srv)
    usage, cached = run_requests(srv)
    check("histograms: the requests succeeded", all(p and c for p, c in usage), usage)
    after = wait_idle(srv)
    _, _, errs, _ = scrape(srv)
    check("histograms: the exposition still parses strictly", not errs, errs[:10])
    k = len(usage)
    prompts, comps = [p for p, _ in usage], [c for _, c in usage]
    d = {n: delta(after, before, n) for n in ENGINE_HISTS + ["time_per_output_token_seconds",
                                                             "request_time_per_output_token_seconds",
                                                             "iteration_tokens_total", "e2e_request_latency_seconds",
                                                             "time_to_first_token_seconds"]}
    counts = {n: d[n]["count"] for n in ENGINE_HISTS + ["e2e_request_latency_seconds", "time_to_first_token_seconds"]}
    check(f"histograms: one observation per request in each ({k})", all(c == k for c in counts.values()), counts)
    pt, gt = d["request_prompt_tokens"], d["request_generation_tokens"]
    check("histograms: request_prompt_tokens sum = usage prompt_tokens", pt["sum"] == sum(prompts), (pt, prompts))
    check("histograms: request_generation_tokens sum = usage completion_tokens", gt["sum"] == sum(comps), (gt, comps))
    check("histograms: prompt token buckets hold the right requests", buckets_match(pt, prompts), pt["buckets"])
    check("histograms: generation token buckets hold the right requests", buckets_match(gt, comps), gt["buckets"])
    tp, rtp = d["time_per_output_token_seconds"], d["request_time_per_output_token_seconds"]
    check("histograms: time_per_output_token count = sum of (completion_tokens - 1)",
          tp["count"] == sum(c - 1 for c in comps), (tp["count"], comps))
    check("histograms: request_time_per_output_token: one per request of more than one token",
          rtp["count"] == sum(1 for c in comps if c > 1), (rtp["count"], comps))
    q, pf, dc, inf = (d[n] for n in ENGINE_HISTS[:4])
    check("histograms: queue time > 0", q["sum"] > 0, q)
    check("histograms: prefill and decode time > 0", pf["sum"] > 0 and dc["sum"] > 0, (pf, dc))
    check("histograms: the token gaps add up to the decode time", close(tp["sum"], dc["sum"]), (tp["sum"], dc["sum"]))
    check("histograms: inference = prefill + decode", close(inf["sum"], pf["sum"] + dc["sum"]), (inf, pf, dc))
    e2e = d["e2e_request_latency_seconds"]
    check("histograms: the server's e2e latency covers queue + inference",
          e2e["sum"] >= q["sum"] + inf["sum"], (e2e["sum"], q["sum"], inf["sum"]))
    pre = value_of(after, P + "num_preemptions_total") - value_of(before, P + "num_preemptions_total")
    it = d["iteration_tokens_total"]
    computed = sum(prompts) - cached + sum(c - 1 for c in comps)  # each token but the last goes back in
    check("histograms: iteration tokens sum to the tokens computed", pre == 0 and it["sum"] == computed,
          (it["sum"], computed, pre))
    check("histograms: iteration steps at least the longest request's tokens",
          max(comps) <= it["count"] <= sum(comps) + k, (it["count"], comps))
    check("histograms: iteration token buckets hold every step", it["buckets"][-1][1] == it["count"], it)

    # n = 2: each choice is one finished sequence, as vLLM counts parallel samples
    before = after
    st, data, _ = srv.post("/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 6, "n": 2, "temperature": 1,
                                               "seed": 3, "ignore_eos": True})
    after = wait_idle(srv)
    ch = json.loads(data)["choices"] if st == 200 else []
    gen = delta(after, before, "request_generation_tokens")
    tp = delta(after, before, "time_per_output_token_seconds")
    check("histograms: n=2 counts each choice", st == 200 and len(ch) == 2 and gen["count"] == 2 and gen["sum"] == 12
          and tp["count"] == 10 and delta(after, before, "request_prompt_tokens")["sum"] == 8, (gen, tp))


def test_queue(srv):
    """Two seats (--max-num-seqs 2): concurrent requests wait for the ones ahead of them."""
    before = wait_idle(srv)
    n, results = 6, []

    def one():
        st, events, done, _ = stream(srv, {"prompt": [1, 11, 12], "max_tokens": 100, "ignore_eos": True,
                                           "stream": True}, timeout=60)
        results.append(st == 200 and done)

    ths = [threading.Thread(target=one) for _ in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(60)
    after = wait_idle(srv)
    q, inf = delta(after, before, "request_queue_time_seconds"), delta(after, before, "request_inference_time_seconds")
    check("queue: the concurrent requests succeeded", results == [True] * n, results)
    check("queue: one observation per request", q["count"] == n and inf["count"] == n, (q, inf))
    # pairs run in turn: the second pair waits one pair's time, the third two: sum(queue) ~ sum(inference)
    check("queue: waiting for a seat shows in the queue time", q["sum"] >= 0.3 * inf["sum"] > 0,
          (q["sum"], inf["sum"]))


def test_bounds(srv):
    _, fams, _, _ = scrape(srv)
    for n in ENGINE_HISTS[:4]:
        check(f"bounds: {n} has vLLM's request latency buckets", bounds_of(hist_of(fams, P + n)) == LATENCY_BOUNDS,
              bounds_of(hist_of(fams, P + n)))
    check("bounds: e2e latency has vLLM's buckets",
          bounds_of(hist_of(fams, P + "e2e_request_latency_seconds")) == LATENCY_BOUNDS)
    check("bounds: time to first token has vLLM's buckets",
          bounds_of(hist_of(fams, P + "time_to_first_token_seconds")) == TTFT_BOUNDS)
    for n in ("time_per_output_token_seconds", "request_time_per_output_token_seconds", "inter_token_latency_seconds"):
        b = bounds_of(hist_of(fams, P + n))
        check(f"bounds: {n} has vLLM's buckets (and finer ones under 10 ms)",
              [x for x in b if x >= 0.01] == VLLM_TPOT_BOUNDS and all(x < 0.01 for x in b[:len(b) - 19]), b)
    check("bounds: iteration tokens has vLLM's buckets",
          bounds_of(hist_of(fams, P + "iteration_tokens_total")) == ITERATION_BOUNDS)
    st, data, _ = srv.get("/v1/models")
    mml = json.loads(data)["data"][0]["max_model_len"]
    want = [m * 10 ** e for e in range(12) for m in (1, 2, 5) if m * 10 ** e <= mml]
    for n in ("request_prompt_tokens", "request_generation_tokens"):
        check(f"bounds: {n} has 1-2-5 buckets up to max_model_len {mml}", bounds_of(hist_of(fams, P + n)) == want,
              bounds_of(hist_of(fams, P + n)))


def test_cache_info(srv):
    _, fams, _, _ = scrape(srv)
    s = fams.get(P + "cache_config_info", {}).get("samples", [])
    lb = s[0][1] if len(s) == 1 else {}
    cap = value_of(fams, P + "kv_cache_capacity_tokens")
    check("cache_config_info: one series of value 1", len(s) == 1 and s[0][2] == 1, s)
    check("cache_config_info: block_size is --block-size", lb.get("block_size") == "32", lb)
    check("cache_config_info: num_gpu_blocks x block_size = the KV capacity",
          lb.get("num_gpu_blocks", "").isdigit() and int(lb["num_gpu_blocks"]) * 32 == cap > 0, (lb, cap))
    check("cache_config_info: the other labels", lb.get("cache_dtype") == "float32"
          and lb.get("num_streaming_slots") == "0" and lb.get("gpu_memory_utilization") == "0.9"
          and lb.get("enable_prefix_caching") == "True" and lb.get("model_name") == os.path.basename(srv.model_name), lb)


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def test_process(srv):
    _, fams, _, _ = scrape(srv)
    v = {n: value_of(fams, n) for n in ("process_resident_memory_bytes", "process_virtual_memory_bytes",
                                        "process_cpu_seconds_total", "process_open_fds", "process_max_fds",
                                        "process_start_time_seconds")}
    if not os.path.exists(f"/proc/{srv.proc.pid}/status"):
        check("process: /proc is there to compare with (skipped)", True)
        return
    ps = proc_status(srv.proc.pid)
    rss = int(ps["VmRSS"].split()[0]) * 1024
    vsz = int(ps["VmSize"].split()[0]) * 1024
    check("process: resident memory as /proc says (within 25%)", v["process_resident_memory_bytes"]
          and abs(v["process_resident_memory_bytes"] - rss) <= 0.25 * rss, (v, rss))
    check("process: virtual memory as /proc says (within 10%) and above resident",
          v["process_virtual_memory_bytes"] and abs(v["process_virtual_memory_bytes"] - vsz) <= 0.1 * vsz
          and v["process_virtual_memory_bytes"] >= v["process_resident_memory_bytes"], (v, vsz))
    # connections close on the server's threads in their time: compare scrapes bracketed by /proc reads
    seen = []
    for _ in range(10):
        lo = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
        got = value_of(scrape(srv)[1], "process_open_fds")
        hi = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
        seen.append((lo, got, hi))
        if got is not None and min(lo, hi) - 2 <= got <= max(lo, hi) + 2:
            break
        time.sleep(0.1)
    check("process: open fds as /proc says", seen[-1][1] is not None
          and min(seen[-1][0], seen[-1][2]) - 2 <= seen[-1][1] <= max(seen[-1][0], seen[-1][2]) + 2, seen)
    soft = None
    with open(f"/proc/{srv.proc.pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft = line.split()[3]
    check("process: max fds is the soft RLIMIT_NOFILE", soft == "unlimited" and v["process_max_fds"] is None
          or soft is not None and v["process_max_fds"] == int(soft), (v, soft))
    st = v["process_start_time_seconds"]
    check("process: start time is when the test started the server",
          st is not None and srv.t_spawn - 2 <= st <= srv.t_spawn + 30, (st, srv.t_spawn))
    cpu0 = v["process_cpu_seconds_total"]
    for _ in range(3):
        srv.post("/v1/completions", {"prompt": [1], "max_tokens": 400, "ignore_eos": True})
    _, fams, _, _ = scrape(srv)
    cpu1 = value_of(fams, "process_cpu_seconds_total")
    elapsed = time.time() - srv.t_spawn
    check("process: cpu seconds > 0 after work, not decreasing, bounded by wall time x cores",
          cpu0 is not None and cpu1 is not None and 0 <= cpu0 <= cpu1 <= elapsed * (os.cpu_count() or 1) + 0.5
          and cpu1 > 0, (cpu0, cpu1, elapsed))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=es.STORIES260K)
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    model = os.path.normpath(args.model)
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"  SKIP: {model} not found")
        print("0 passed, 0 failed")
        return 0
    tests = [("format", test_format), ("histograms", test_histograms), ("queue", test_queue),
             ("bounds", test_bounds), ("cache_info", test_cache_info), ("process", test_process)]
    srv = None
    try:
        t_spawn = time.time()
        srv = Server(args.bin, model, "--max-num-seqs", "2", "--block-size", "32")
        srv.t_spawn, srv.model_name = t_spawn, model
        for name, fn in tests:
            if args.k in name:
                print(f"== {name}")
                try:
                    fn(srv)
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
