#!/usr/bin/env python3
"""Long-prompt benchmark against a running OpenAI-compatible server (duoserve serve).

Python standard library only. Three measurements (alone and beside for every size N given):

  * alone (--alone N,...): the time to first token (TTFT) of an N-token prompt with nothing
    else running: from sending the request to the first SSE chunk that carries a choice.
  * beside (--beside N,...): a streaming request runs first (a short prompt, --stream-max-tokens,
    ignore_eos); once it has produced --stream-lead tokens the N-token prompt is sent, and the
    report gives the long prompt's TTFT and the stream's inter-token latency (ITL: the gaps
    between its chunks) during the long prefill: median, p99 and max of the gaps that end after
    the long prompt was sent, up to and including the first that ends after its first token.
    The stream must outlast the prefill (else the measurement is marked "not covered" and the
    run fails: raise --stream-max-tokens). Its ITL before the long prompt is reported too.

  * hold (--hold N:L:M): N requests of L-token prompts sent at once, each asking M tokens
    (ignore_eos): whether all N were answered, and the context the server held for all of them
    at once: the sum of prompt and generated tokens of every request at the moment the last one
    got its first token, provided no request had ended by then (else "not concurrent": raise M).
    /metrics is read every 0.25 s meanwhile (the peak of duoserve:num_requests_running and of
    duoserve:kv_cache_usage_perc). It proves a KV pool, e.g. 96:32768:512 for ~3.2M tokens.

Prompts are random token ids (--id-range, --seed), a new draw for every request, so that no
request finds another's prefix in the server's prefix cache; /v1/completions takes them as
"prompt": [ids]. Every request asks for logprobs 0, so that each token is a chunk of its own
(a server holds back the text of a partial UTF-8 character otherwise) and max_tokens 1 for the
long prompt. A short warm-up request goes first (--warmup).

With two or more sizes alone, a fit of TTFT = a N + b N^2 / 2 (+ c with three or more) gives
the seconds a prompt token costs in the linear layers (a) and a query-key pair in attention (b):
b / a is the attention cost of a query-key pair in tokens, the number duoserve's scheduler
estimates and logs at start ("step cost: attention X a query-key pair"). Meaningful with full
attention (a head pattern makes the pairs cheaper past the streaming window).

Bounds: each request has --timeout (default 900 s); the whole run --max-duration (default
3600 s), after which the remaining measurements are skipped and reported as such.

Example:
  python3 scripts/bench_long.py --base-url http://127.0.0.1:8000 --alone 65536,131072 \\
      --beside 131072 --result-json long.json
Exit status: 0 when every measurement was made, 1 when one failed or was skipped, 2 usage.
"""

import argparse
import http.client
import json
import os
import random
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True  # importing the bench_* modules must not leave scripts/__pycache__ behind
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_client import Server, error_message  # noqa: E402
from bench_report import percentile  # noqa: E402


class Failed(Exception):
    pass


def stream_completion(server, body, deadline, on_chunk, holder=None, stop=None):
    """POSTs a streamed /v1/completions and reads its SSE until the end, stop, or on_chunk
    returning True; on_chunk(ts, chunk) gets the arrival time of every chunk carrying a choice.
    holder["sock"] is the socket while it reads (another thread may shut it down). Returns the
    usage object if one came. Raises Failed."""
    payload = json.dumps(body).encode()
    conn = None
    usage = None
    try:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise Failed("no time left (--timeout / --max-duration)")
        conn = server.connect(left)
        conn.request("POST", server.prefix + "/v1/completions", body=payload, headers=server.headers(True))
        sock = conn.sock
        if holder is not None:
            holder["sock"] = sock
        resp = conn.getresponse()
        if resp.status != 200:
            raise Failed(f"HTTP {resp.status}: {error_message(resp.read())}")
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise Failed("timed out")
            if stop is not None and stop.is_set():
                return usage
            sock.settimeout(left)
            line = resp.readline()
            if not line:
                return usage
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments (keep-alive), other fields
            data = line[5:].strip()
            if data == b"[DONE]":
                return usage
            try:
                obj = json.loads(data)
            except ValueError:
                raise Failed(f"bad SSE data: {data[:200]!r}")
            if not isinstance(obj, dict):
                continue
            if "error" in obj:
                raise Failed("error in stream: " + error_message(json.dumps(obj)))
            if isinstance(obj.get("usage"), dict):
                usage = obj["usage"]
            if obj.get("choices") and on_chunk(time.perf_counter(), obj):
                return usage
    except (socket.timeout, TimeoutError):
        if stop is not None and stop.is_set():
            return usage
        raise Failed("timed out")
    except (OSError, http.client.HTTPException) as e:
        if stop is not None and stop.is_set():
            return usage  # shut down on purpose
        raise Failed(f"{type(e).__name__}: {e}")
    finally:
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass


class Bench:
    def __init__(self, args, server, model):
        self.args = args
        self.server = server
        self.model = model
        self.rng = random.Random(args.seed)
        self.run_deadline = time.perf_counter() + args.max_duration

    def ids(self, n):
        lo, hi = self.args.id_range
        return [self.rng.randrange(lo, hi) for _ in range(n)]

    def deadline(self):
        return min(time.perf_counter() + self.args.timeout, self.run_deadline)

    def body(self, prompt, max_tokens):
        return {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "logprobs": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    def ttft(self, n):
        """-> (TTFT in seconds from the send, the send time, prompt tokens the server counted)."""
        body = self.body(self.ids(n), 1)
        first = []

        def on_chunk(ts, obj):
            first.append(ts)
            return False  # read on to the usage chunk

        t0 = time.perf_counter()
        usage = stream_completion(self.server, body, self.deadline(), on_chunk)
        if not first:
            raise Failed("the stream ended without a token")
        pt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if isinstance(pt, int) and pt != n:
            raise Failed(f"the server counted {pt} prompt tokens, not {n}")
        return first[0] - t0, t0, pt

    def alone(self, n):
        t, _, pt = self.ttft(n)
        return {"n": n, "ttft_s": t, "prompt_tokens": pt}

    def beside(self, n):
        a = self.args
        stamps, err = [], []
        lead = threading.Event()
        stop = threading.Event()
        holder = {}

        def on_chunk(ts, obj):
            stamps.append(ts)
            if len(stamps) >= a.stream_lead:
                lead.set()
            return False

        def run_stream():
            try:
                stream_completion(self.server, self.body(self.ids(a.stream_prompt_len), a.stream_max_tokens),
                                  self.deadline(), on_chunk, holder, stop)
            except Failed as e:
                err.append(str(e))
            finally:
                lead.set()

        th = threading.Thread(target=run_stream, daemon=True)
        th.start()
        lead.wait(max(0.0, self.deadline() - time.perf_counter()))
        if err or len(stamps) < a.stream_lead:
            stop.set()
            th.join(5)
            raise Failed("the streaming request: " + (err[0] if err else f"fewer than {a.stream_lead} tokens"))
        t = None
        try:
            t, t_send, pt = self.ttft(n)
        finally:
            # the stream's chunk of the step that gave the long prompt its token (up to 5 s)
            wait_until = time.perf_counter() + 5
            while t is not None and th.is_alive() and stamps[-1] <= t_send + t and time.perf_counter() < wait_until:
                time.sleep(0.001)
            stop.set()
            s = holder.get("sock")
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            th.join(10)
        t_first = t_send + t
        ts = list(stamps)
        gaps = [(ts[i], ts[i] - ts[i - 1]) for i in range(1, len(ts))]
        before = [g for end, g in gaps if end <= t_send]
        during = []
        for end, g in gaps:
            if end > t_send:
                during.append(g)
                if end > t_first:
                    break
        covered = bool(ts) and ts[-1] > t_first
        if err and not covered:
            raise Failed("the streaming request: " + err[0])
        return {"n": n, "ttft_s": t, "prompt_tokens": pt, "covered": covered, "stream_tokens": len(ts),
                "itl_during_ms": ms_stats(during), "itl_before_ms": ms_stats(before)}

    def hold(self, spec):
        n, length, max_tokens = spec
        starts, ends, stamps, errs = [None] * n, [None] * n, [[] for _ in range(n)], []
        stop = threading.Event()
        peak = {"running": 0.0, "usage": 0.0}

        def poll():
            while not stop.wait(0.25):
                try:
                    text = self.server.text_call("/metrics")
                except RuntimeError:
                    continue
                for line in text.splitlines():
                    for key, name in (("running", "duoserve:num_requests_running"), ("usage", "duoserve:kv_cache_usage_perc")):
                        if line.startswith(name) and (key == "running" or 'pool="full"' in line):
                            try:
                                peak[key] = max(peak[key], float(line.split()[-1]))
                            except ValueError:
                                pass

        def one(i, prompt):
            def on_chunk(ts, obj):
                stamps[i].append(ts)
                return False
            try:
                starts[i] = time.perf_counter()
                usage = stream_completion(self.server, self.body(prompt, max_tokens), self.deadline(), on_chunk)
                ends[i] = time.perf_counter()
                got = usage.get("completion_tokens") if isinstance(usage, dict) else None
                if got != max_tokens or not stamps[i]:
                    errs.append(f"request {i}: {got} of {max_tokens} tokens")
            except Failed as e:
                errs.append(f"request {i}: {e}")

        prompts = [self.ids(length) for _ in range(n)]
        ths = [threading.Thread(target=one, args=(i, prompts[i]), daemon=True) for i in range(n)]
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        t0 = time.perf_counter()
        for th in ths:
            th.start()
        for th in ths:
            th.join(max(0.0, self.deadline() - time.perf_counter()) + 5)
        stop.set()
        poller.join(5)
        if errs:
            raise Failed(f"{len(errs)} of {n} requests failed: " + "; ".join(errs[:3]))
        last_in = max(st[0] for st in stamps)
        # the context held at the moment the last request got its first token: every prompt and the
        # tokens each had received by then, if none had ended
        return {"n": n, "prompt_tokens": length, "max_tokens": max_tokens, "concurrent": min(ends) > last_in,
                "held_tokens": n * length + sum(sum(1 for t in st if t <= last_in) for st in stamps),
                "all_in_s": last_in - t0, "duration_s": max(ends) - t0,
                "ttft_max_s": max(st[0] - t for st, t in zip(stamps, starts)),
                "peak_running": peak["running"], "peak_kv_usage": peak["usage"]}


def ms_stats(xs):
    if not xs:
        return {"count": 0, "median": None, "p99": None, "max": None}
    return {"count": len(xs), "median": percentile(xs, 50) * 1000, "p99": percentile(xs, 99) * 1000,
            "max": max(xs) * 1000}


def fit(points):
    """Least squares of t = a n + b n^2 / 2 (+ c with three or more points) -> dict or None."""
    if len({n for n, _ in points}) < 2:
        return None
    cols = [lambda n: n, lambda n: n * n / 2.0]
    if len({n for n, _ in points}) >= 3:
        cols.append(lambda n: 1.0)
    k = len(cols)
    # normal equations, solved by Gaussian elimination (k <= 3)
    m = [[sum(cols[i](n) * cols[j](n) for n, _ in points) for j in range(k)] +
         [sum(cols[i](n) * t for n, t in points)] for i in range(k)]
    for i in range(k):
        p = max(range(i, k), key=lambda r: abs(m[r][i]))
        m[i], m[p] = m[p], m[i]
        if m[i][i] == 0:
            return None
        for r in range(k):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [x - f * y for x, y in zip(m[r], m[i])]
    sol = [m[i][k] / m[i][i] for i in range(k)]
    a, b = sol[0], sol[1]
    return {"s_per_token": a, "s_per_pair": b, "pair_in_tokens": b / a if a > 0 else None,
            "s_fixed": sol[2] if k == 3 else None}


def parse_sizes(v):
    try:
        out = [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a comma-separated list of token counts")
    if not out or any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"{v!r}: token counts must be positive")
    return out


def parse_hold(v):
    try:
        out = tuple(int(x) for x in v.split(":"))
    except ValueError:
        out = ()
    if len(out) != 3 or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{v!r} is not N:L:M (requests, prompt tokens, max_tokens; all positive)")
    return out


def parse_range(v):
    try:
        lo, hi = (int(x) for x in v.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not LO:HI")
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"{v!r}: need 0 <= LO < HI")
    return lo, hi


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key", default=os.environ.get("DUOSERVE_API_KEY"))
    p.add_argument("--model", help="model id (default: the first of /v1/models)")
    p.add_argument("--alone", type=parse_sizes, default=[], metavar="N,...", help="TTFT of N-token prompts alone")
    p.add_argument("--beside", type=parse_sizes, default=[], metavar="N,...",
                   help="N-token prompts sent beside a streaming request: their TTFT and the stream's ITL")
    p.add_argument("--hold", type=parse_hold, metavar="N:L:M",
                   help="N requests of L-token prompts at once, M tokens each: the context held for all at once")
    p.add_argument("--repeat", type=int, default=1, help="measurements of each size (default 1)")
    p.add_argument("--stream-max-tokens", type=int, default=8192, help="the streaming request's max_tokens (default 8192)")
    p.add_argument("--stream-prompt-len", type=int, default=16, help="its prompt's tokens (default 16)")
    p.add_argument("--stream-lead", type=int, default=16,
                   help="tokens the stream produces before the long prompt is sent (default 16)")
    p.add_argument("--id-range", type=parse_range, default=(1000, 30000), metavar="LO:HI",
                   help="random prompt ids from [LO, HI) (default 1000:30000; below the model's vocabulary)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=64, help="tokens of a warm-up request first (0: none; default 64)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a request may take (default 900)")
    p.add_argument("--max-duration", type=float, default=3600.0, help="seconds the whole run may take (default 3600)")
    p.add_argument("--result-json", help="write the results as JSON to this file (- for stdout)")
    a = p.parse_args(argv)
    if not a.alone and not a.beside and not a.hold:
        p.error("nothing to measure: give --alone, --beside and/or --hold")
    for name in ("repeat", "stream_max_tokens", "stream_prompt_len", "stream_lead"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.stream_lead >= a.stream_max_tokens:
        p.error("--stream-lead must be below --stream-max-tokens")
    if a.warmup < 0 or a.timeout <= 0 or a.max_duration <= 0:
        p.error("--warmup must be >= 0, --timeout and --max-duration > 0")
    return a


def fmt_ms(x):
    return "-" if x is None else f"{x:.1f}"


def main(argv=None):
    a = parse_args(argv)
    server = Server(a.base_url, a.api_key, min(a.timeout, 60.0))
    model = a.model
    if not model:
        try:
            model = server.json_call("GET", "/v1/models")["data"][0]["id"]
        except (RuntimeError, KeyError, IndexError, TypeError) as e:
            raise SystemExit(f"bench_long: cannot find the model at {a.base_url}/v1/models ({e}); pass --model")
    b = Bench(a, server, model)
    out = {"model": model, "base_url": a.base_url, "seed": a.seed, "alone": [], "beside": [], "hold": [],
           "failed": [], "skipped": []}
    tty = sys.stdout if a.result_json != "-" else sys.stderr
    print(f"bench_long: {model} at {a.base_url}", file=tty)
    if a.warmup:
        try:
            b.ttft(a.warmup)
        except Failed as e:
            print(f"bench_long: the warm-up request failed: {e}", file=sys.stderr)
            out["failed"].append({"what": "warm-up", "error": str(e)})
    jobs = [("alone", n) for n in a.alone for _ in range(a.repeat)] + \
           [("beside", n) for n in a.beside for _ in range(a.repeat)] + ([("hold", a.hold)] if a.hold else [])
    for what, n in jobs:
        if time.perf_counter() >= b.run_deadline:
            out["skipped"].append({"what": what, "n": n})
            continue
        try:
            r = b.alone(n) if what == "alone" else b.beside(n) if what == "beside" else b.hold(n)
        except Failed as e:
            print(f"  {what} {n}: FAILED: {e}", file=tty)
            out["failed"].append({"what": what, "n": n, "error": str(e)})
            continue
        out[what].append(r)
        if what == "alone":
            print(f"  alone  {n:>8} tokens: TTFT {r['ttft_s']:.3f} s", file=tty)
        elif what == "hold":
            print(f"  hold {r['n']} x {r['prompt_tokens']} tokens, {r['max_tokens']} each: all answered; "
                  f"{r['held_tokens']:,} tokens of context held at once{'' if r['concurrent'] else ' (NOT CONCURRENT)'} "
                  f"{r['all_in_s']:.1f} s after the send (last TTFT {r['ttft_max_s']:.1f} s), all done in "
                  f"{r['duration_s']:.1f} s; /metrics peak: {r['peak_running']:.0f} running, KV usage "
                  f"{r['peak_kv_usage'] * 100:.1f}%", file=tty)
        else:
            d, bf = r["itl_during_ms"], r["itl_before_ms"]
            print(f"  beside {n:>8} tokens: TTFT {r['ttft_s']:.3f} s; stream ITL during the prefill: median "
                  f"{fmt_ms(d['median'])} p99 {fmt_ms(d['p99'])} max {fmt_ms(d['max'])} ms ({d['count']} gaps; "
                  f"before: median {fmt_ms(bf['median'])} ms){'' if r['covered'] else '; NOT COVERED: the stream ended first'}",
                  file=tty)
        tty.flush()
    growth = {}
    for n in sorted(set(a.alone) & set(a.beside)):
        t1 = [r["ttft_s"] for r in out["alone"] if r["n"] == n]
        t2 = [r["ttft_s"] for r in out["beside"] if r["n"] == n]
        if t1 and t2:
            growth[str(n)] = percentile(t2, 50) / percentile(t1, 50) - 1
            print(f"  TTFT of {n} tokens beside the stream: {growth[str(n)] * 100:+.1f}% against alone", file=tty)
    out["ttft_growth"] = growth
    f = fit([(r["n"], r["ttft_s"]) for r in out["alone"]])
    out["fit"] = f
    if f:
        print(f"  fit of TTFT alone: {f['s_per_token'] * 1e6:.2f} us a token, {f['s_per_pair'] * 1e12:.1f} ps a "
              f"query-key pair: a pair costs {fmt_pair(f['pair_in_tokens'])} tokens", file=tty)
    uncovered = [r for r in out["beside"] if not r["covered"]] + [r for r in out["hold"] if not r["concurrent"]]
    if a.result_json:
        text = json.dumps(out, indent=1)
        if a.result_json == "-":
            print(text)
        else:
            with open(a.result_json, "w") as fh:
                fh.write(text + "\n")
    return 1 if out["failed"] or out["skipped"] or uncovered else 0


def fmt_pair(x):
    return "-" if x is None else f"{x:.3g}"


if __name__ == "__main__":
    sys.exit(main())
