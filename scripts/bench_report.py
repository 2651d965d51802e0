"""bench_report: the numbers of a scripts/bench_serving.py run: percentiles as numpy computes them,
goodput SLOs, the summary, the prefix cache's counters from /metrics, the printed report (vLLM's
layout) and the result JSON. Python standard library only."""
import datetime
import json
import math
import os
import re


def percentile(xs, q):
    """numpy.percentile's default (linear interpolation)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# --percentile-metrics names, in report order: (short name, section title)
METRICS = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
           "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def stats_ms(xs, percentiles):
    """Mean, median, std and the given percentiles of xs (seconds), in ms; zeros when empty (as vLLM)."""
    xs = xs or [0.0]
    n = len(xs)
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
    return {"mean": mean * 1000, "median": percentile(xs, 50) * 1000, "std": std * 1000,
            "percentiles": [(p, percentile(xs, p) * 1000) for p in percentiles]}


def percentile_name(p):
    """vLLM's label of a percentile: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def parse_goodput(pairs):
    """vLLM's --goodput KEY:VALUE pairs (KEY ttft, tpot or e2el; VALUE milliseconds >= 0) -> {KEY: seconds}."""
    slos = {}
    for pair in pairs:
        name, sep, val = pair.partition(":")
        try:
            ms = float(val) if sep else None
        except ValueError:
            ms = None
        if ms is None:
            raise ValueError(f"--goodput {pair!r}: give KEY:VALUE pairs, the value in milliseconds (e.g. ttft:500)")
        if name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput {pair!r}: the metric must be one of {', '.join(GOODPUT_METRICS)}")
        if not (0 <= ms < math.inf):
            raise ValueError(f"--goodput {pair!r}: the value must be a non-negative number of milliseconds")
        slos[name] = ms / 1000.0
    return slos


def meets_slos(r, slos):
    """Whether a finished request meets every goodput objective (TPOT counts as 0 for one token, as vLLM)."""
    tpot = (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
    got = {"ttft": r.ttft, "tpot": tpot, "e2el": r.latency}
    return all(got[k] <= v for k, v in slos.items())


def summarize(args, results, duration, n_unsent, n_unfinished):
    """The run's numbers, as vLLM's calculate_metrics (plus what did not finish)."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if r.status in ("failed", "timeout")]
    abandoned = [r for r in results if r.status == "abandoned"]
    in_lens = [r.prompt_tokens if r.prompt_tokens is not None else r.req["prompt_len"] for r in ok]
    out_lens = [r.output_tokens for r in ok]
    samples = {"ttft": [r.ttft for r in ok],
               "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
               "itl": [g for r in ok for g in r.itl],
               "e2el": [r.latency for r in ok]}
    first_error = None
    for r in sorted(failed + abandoned, key=lambda r: r.end):
        first_error = r.error
        break
    return {
        "results": results, "ok": ok, "failed": failed, "duration": duration,
        "n_abandoned": len(abandoned) + n_unfinished, "n_unsent": n_unsent,
        "in_lens": in_lens, "out_lens": out_lens, "total_in": sum(in_lens), "total_out": sum(out_lens),
        "prompt_est": sum(1 for r in ok if r.prompt_tokens is None), "out_est": sum(1 for r in ok if not r.usage_seen),
        "samples": samples,
        "stats": {k: stats_ms(v, args.metric_percentiles) for k, v in samples.items()},
        "goodput": (sum(1 for r in ok if meets_slos(r, args.goodput)) / duration) if args.goodput else None,
        "first_error": first_error,
    }


def cache_hit_rate(results):
    """Sum of usage cached_tokens over the sum of prompt tokens of the answers that carry it; None if none does."""
    rs = [r for r in results if r.cached_tokens is not None and r.prompt_tokens is not None]
    prompt = sum(r.prompt_tokens for r in rs)
    return sum(r.cached_tokens for r in rs) / prompt if prompt else None


def summarize_multi_turn(args, run, jobs, turns_sent, cache_before, cache_after):
    """--multi-turn's numbers: conversations, turns, TTFT of first and later turns, prefix cache hit rates."""
    ok = run["ok"]
    ok_turns = {}
    for r in ok:
        ok_turns[r.req["conv"]] = ok_turns.get(r.req["conv"], 0) + 1
    first = [r.ttft for r in ok if r.req["turn"] == 0]
    later = [r.ttft for r in ok if r.req["turn"] > 0]
    metrics = None
    if cache_before and cache_after and cache_after["queries"] > cache_before["queries"]:
        metrics = (cache_after["hits"] - cache_before["hits"]) / (cache_after["queries"] - cache_before["queries"])
    return {
        "conversations": len(jobs),
        "context_tokens_mean": sum(j[0]["context_len"] for j in jobs) / len(jobs) if jobs else 0.0,
        "conversations_completed": sum(1 for j in jobs if ok_turns.get(j[0]["conv"], 0) == len(j)),
        "turns_planned": sum(len(j) for j in jobs),
        "turns_sent": turns_sent,
        "turns_first": len(first), "turns_later": len(later),
        "ttft_first": stats_ms(first, args.metric_percentiles) if first else None,
        "ttft_later": stats_ms(later, args.metric_percentiles) if later else None,
        "cached_usage": sum(1 for r in ok if r.cached_tokens is not None),
        "hit_rate_usage": cache_hit_rate(ok),
        "hit_rate_usage_later": cache_hit_rate([r for r in ok if r.req["turn"] > 0]),
        "cache_counters": (None if not (cache_before and cache_after) else
                           {k: cache_after[k] - cache_before[k] for k in ("queries", "hits")}),
        "hit_rate_metrics": metrics,
    }


# /metrics counters of prefix cache lookups, in tokens (vLLM's vllm:prefix_cache_queries / _hits)
PREFIX_CACHE_RE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*:)?(?:gpu_)?prefix_cache_(queries|hits)(?:_total)?"
                             r"(?:\{[^}]*\})?\s+(\S+)")


def prefix_cache_counters(server):
    """The server's prefix cache counters from GET /metrics, each summed over its label sets:
    {"queries": q, "hits": h}, or None when the server has no such counters or no /metrics."""
    try:
        text = server.text_call("/metrics")
    except RuntimeError:
        return None
    got = {}
    for line in text.splitlines():
        m = PREFIX_CACHE_RE.match(line)
        if m:
            try:
                got[m.group(1)] = got.get(m.group(1), 0.0) + float(m.group(2))
            except ValueError:
                continue
    return got if len(got) == 2 else None


def print_report(args, run, interrupted, mt=None):
    w, dur = 40, run["duration"]
    line = "{:<{w}} {:<10}".format
    num = "{:<{w}} {:<10.2f}".format
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print(line("Successful requests:", len(run["ok"]), w=w))
    if run["failed"]:
        print(line("Failed requests:", len(run["failed"]), w=w))
    if run["n_abandoned"] or run["n_unsent"]:
        print(line("Abandoned requests (unfinished at end):", run["n_abandoned"], w=w))
        print(line("Requests not sent (time ran out):" if mt is None else
                   "Turns not sent (time, or a turn failed):", run["n_unsent"], w=w))
    print(num("Benchmark duration (s):", dur, w=w))
    print(line("Total input tokens:", run["total_in"], w=w))
    print(line("Total generated tokens:", run["total_out"], w=w))
    print(num("Request throughput (req/s):", len(run["ok"]) / dur, w=w))
    if run["goodput"] is not None:
        print(num("Request goodput (req/s):", run["goodput"], w=w))
    print(num("Output token throughput (tok/s):", run["total_out"] / dur, w=w))
    st_ok = [r for r in run["ok"] if r.req.get("structured")]
    if any(r.req.get("structured") for r in run["results"]):
        print(line("Structured requests (ok):", len(st_ok), w=w))
        print(line("Structured output tokens:", sum(r.output_tokens for r in st_ok), w=w))
    print(num("Total Token throughput (tok/s):", (run["total_in"] + run["total_out"]) / dur, w=w))
    for key, (name, title) in METRICS.items():
        if key not in args.percentile_metrics:
            continue
        st = run["stats"][key]
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        print(num(f"Mean {name} (ms):", st["mean"], w=w))
        print(num(f"Median {name} (ms):", st["median"], w=w))
        for p, v in st["percentiles"]:
            print(num(f"P{percentile_name(p)} {name} (ms):", v, w=w))
    if mt is not None:
        print_multi_turn(mt, w)
    print("=" * 50)
    if run["prompt_est"]:
        print(f"note: {run['prompt_est']} requests had no usage.prompt_tokens; "
              "their input tokens are the dataset's count")
    if run["out_est"]:
        print(f"note: {run['out_est']} requests had no usage.completion_tokens; their output tokens are chunk counts")
    if run["first_error"]:
        print(f"First error: {run['first_error']}")
    if interrupted:
        print("note: the run was interrupted (Ctrl-C)")


def print_multi_turn(mt, w):
    line = "{:<{w}} {:<10}".format
    num = "{:<{w}} {:<10.2f}".format

    def rate(x):
        return "n/a" if x is None else f"{x:.4f}"

    print("{s:{c}^{n}}".format(s="Multi-turn Conversations", n=50, c="-"))
    print(line("Conversations:", mt["conversations"], w=w))
    if mt["context_tokens_mean"]:
        print(num("Context document tokens (mean):", mt["context_tokens_mean"], w=w))
    print(line("Conversations completed (every turn):", mt["conversations_completed"], w=w))
    print(line("Turns sent:", mt["turns_sent"], w=w))
    print(line("Turns ok (first / later):", f"{mt['turns_first']} / {mt['turns_later']}", w=w))
    for key, title in (("ttft_first", "first turns"), ("ttft_later", "later turns")):
        st = mt[key]
        if st is None:
            print(line(f"TTFT of {title} (ms):", "n/a", w=w))
            continue
        print(num(f"Mean TTFT {title} (ms):", st["mean"], w=w))
        print(num(f"Median TTFT {title} (ms):", st["median"], w=w))
        for p, v in st["percentiles"]:
            print(num(f"P{percentile_name(p)} TTFT {title} (ms):", v, w=w))
    print(line("Prefix cache hit rate (usage):", rate(mt["hit_rate_usage"]), w=w))
    print(line("  later turns only:", rate(mt["hit_rate_usage_later"]), w=w))
    print(line("Prefix cache hit rate (/metrics):", rate(mt["hit_rate_metrics"]), w=w))
    if mt["hit_rate_usage"] is not None and mt["cached_usage"] < mt["turns_first"] + mt["turns_later"]:
        print(f"note: only {mt['cached_usage']} answers carried usage.prompt_tokens_details.cached_tokens")


def write_result_json(args, run, model, reqs, dropped, use_server_tok, interrupted, mt=None):
    ok, dur = run["ok"], run["duration"]
    res = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": args.backend,
        "base_url": args.base_url,
        "endpoint": args.endpoint,
        "model_id": model,
        "tokenizer_id": args.tokenizer_dir,
        "token_counts": "server /tokenize" if use_server_tok else "estimated chars/4",
        "dataset": args.dataset,
        "output_lens_csv": args.output_lens_csv,
        "num_prompts": len(reqs),
        "num_prompts_requested": args.num_prompts,
        "filter_dropped": dropped,
        "max_prompt_len": args.max_prompt_len,
        "max_total_len": args.max_total_len,
        "request_rate": args.request_rate if not math.isinf(args.request_rate) else "inf",
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "ignore_eos": args.ignore_eos,
        "temperature": args.temperature,
        "seed": args.seed,
        "request_timeout": args.request_timeout,
        "max_duration": args.max_duration,
        "ttft_definition": "first chunk with a choice (text may be empty; a chat role-only chunk does not count)",
        "duration": dur,
        "completed": len(ok),
        "failed": len(run["failed"]),
        "abandoned": run["n_abandoned"],
        "not_sent": run["n_unsent"],
        "first_error": run["first_error"],
        "interrupted": interrupted,
        "total_input_tokens": run["total_in"],
        "total_output_tokens": run["total_out"],
        "request_throughput": len(ok) / dur,
        "request_goodput": run["goodput"],
        "goodput_slos_ms": {k: v * 1000 for k, v in args.goodput.items()} or None,
        "output_throughput": run["total_out"] / dur,
        "total_token_throughput": (run["total_in"] + run["total_out"]) / dur,
    }
    for key in METRICS:
        if key not in args.percentile_metrics:
            continue
        st = run["stats"][key]
        for name in ("mean", "median", "std"):
            res[f"{name}_{key}_ms"] = st[name]
        for p, v in st["percentiles"]:
            res[f"p{percentile_name(p)}_{key}_ms"] = v
    res["multi_turn"] = mt is not None
    if mt is not None:
        res.update({"conversations": mt["conversations"], "conversations_completed": mt["conversations_completed"],
                    "max_turns": args.max_turns, "turns_planned": mt["turns_planned"],
                    "turns_cut_by_filter": mt["turns_cut"], "turns_sent": mt["turns_sent"],
                    "turns_not_sent": run["n_unsent"], "turns_ok_first": mt["turns_first"],
                    "turns_ok_later": mt["turns_later"]})
        for key, prefix in (("ttft_first", "first_turn"), ("ttft_later", "later_turns")):
            st = mt[key]
            for name in ("mean", "median", "std"):
                res[f"{prefix}_{name}_ttft_ms"] = st[name] if st else None
            for p in args.metric_percentiles:
                res[f"{prefix}_p{percentile_name(p)}_ttft_ms"] = dict(st["percentiles"])[p] if st else None
        res.update({"prefix_cache_hit_rate_usage": mt["hit_rate_usage"],
                    "prefix_cache_hit_rate_usage_later_turns": mt["hit_rate_usage_later"],
                    "answers_with_cached_tokens": mt["cached_usage"],
                    "prefix_cache_hit_rate_metrics": mt["hit_rate_metrics"],
                    "prefix_cache_counters_delta": mt["cache_counters"]})
    if args.save_detailed:
        res["input_lens"] = run["in_lens"]
        res["output_lens"] = run["out_lens"]
        res["requested_output_lens"] = [r.req["output_len"] for r in ok]
        res["ttfts"] = run["samples"]["ttft"]
        res["itls"] = [r.itl for r in ok]
        res["e2els"] = run["samples"]["e2el"]
        res["generated_texts"] = ["".join(r.text) for r in ok]
        if mt is not None:
            res["turns"] = [[r.req["conv"], r.req["turn"]] for r in ok]  # (conversation, turn) of each above
            res["prompt_tokens"] = [r.prompt_tokens for r in ok]
            res["cached_tokens"] = [r.cached_tokens for r in ok]
        res["errors"] = [r.error for r in sorted(run["results"], key=lambda r: r.start) if not r.ok]
    tmp = args.result_json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    os.replace(tmp, args.result_json)
    print(f"Results written to {args.result_json}")
