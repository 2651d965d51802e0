#!/usr/bin/env python3
"""Soak test of `duoserve serve`: RSS over a long mixed load, then after many dropped streams.

Starts the server (--bin, --model, extra flags after --), drives a mixed load from a few threads
at --rate requests a second for --minutes (or --seconds): completions streamed and not (some
with logprobs), /tokenize and /detokenize, client errors, probes, and streams dropped after
their first event. RSS (/proc/PID/status) is sampled all along. After a warm-up (10% of the
run, at least 60 s, at most 5 min; 30% for runs under 2 min) the drift is the median of the
last three samples minus the median of the first three; the slope is the least-squares fit.
Then --dropped streams are opened and dropped after their first event; once the server reports
no running or waiting request, no KV in use and the file descriptors back, RSS is compared
with its value before. The issue's bounds (29): drift < 4 MiB over 30 minutes, RSS back within
8 MiB after 1,000 dropped streams.

Exit status 1 on any unexpected status, a sanitizer report in the server's log, or (with
--strict) an RSS bound missed. Not part of `make test` (tests/e2e_hostile.py runs it briefly).

usage: scripts/soak.py [--bin build/duoserve] [--model DIR] [--minutes 30] [--rate 6] [--dropped 1000]
                       [--threads 4] [--strict] [--json] [-- extra serve flags]
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("once upon a time there was a little girl named Lily she liked to play with her ball in the park "
         "one day the sun was big and red Tom said hello to the dog").split()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def n_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Server:
    def __init__(self, binary, model, extra):
        args = [binary, "serve", "--host", "127.0.0.1", "--port", "0"] + (["-m", model] if model else []) + extra
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines, self.port = [], None
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None:
            if self.port:
                try:
                    if self.request("GET", "/health")[0] == 200:
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError("the server did not start: " + "".join(self.lines)[-1500:])

    def _read(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            if len(self.lines) < 200000:
                self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m and not self.port:
                self.port = int(m.group(1))

    def request(self, method, path, body=None, conn=None, timeout=60):
        c = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            c.request(method, path, body=data, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            if conn is None:
                c.close()

    def metrics(self):
        _, data = self.request("GET", "/metrics")
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                out[re.sub(r'model_name="[^"]*",?', "", k).replace("{}", "")] = float(v)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        time.sleep(0.2)
        return self.proc.returncode


def drop_stream(port, max_tokens=200):
    """Opens a stream, reads its first event, drops the connection."""
    body = json.dumps({"prompt": " ".join(random.choices(WORDS, k=6)), "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        got, deadline = b"", time.time() + 30
        while b"data: " not in got and time.time() < deadline:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return b"data: " in got
    finally:
        s.close()


def one_request(srv, conn, rng):
    """One request of the mix; returns (kind, ok)."""
    prompt = " ".join(rng.choices(WORDS, k=rng.randint(2, 40)))
    x = rng.random()
    if x < 0.30:
        body = {"prompt": prompt, "max_tokens": rng.randint(4, 64), "temperature": rng.choice([0, 0.7, 1.0])}
        if rng.random() < 0.3:
            body["logprobs"] = rng.randint(0, 5)
        if rng.random() < 0.2:
            body["n"] = 2
        st, _ = srv.request("POST", "/v1/completions", body, conn)
        return "completion", st == 200
    if x < 0.55:
        body = {"prompt": prompt, "max_tokens": rng.randint(4, 64), "stream": True,
                "stream_options": {"include_usage": True}}
        st, data = srv.request("POST", "/v1/completions", body, conn)
        return "stream", st == 200 and data.rstrip().endswith(b"data: [DONE]")
    if x < 0.65:
        st, data = srv.request("POST", "/tokenize", {"prompt": prompt, "return_token_strs": rng.random() < 0.5}, conn)
        if st != 200:
            return "tokenize", False
        st, _ = srv.request("POST", "/detokenize", {"tokens": json.loads(data)["tokens"]}, conn)
        return "tokenize", st == 200
    if x < 0.75:
        case = rng.randint(0, 4)
        if case == 0:
            st, _ = srv.request("POST", "/v1/completions", b'{"prompt": [1', conn)
        elif case == 1:
            st, _ = srv.request("POST", "/v1/completions", {"prompt": prompt, "temprature": 1}, conn)
        elif case == 2:
            st, _ = srv.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 10**7}, conn)
        elif case == 3:
            st, _ = srv.request("POST", "/v1/completions", {"prompt": prompt, "model": "nope"}, conn)
        else:
            st, _ = srv.request("GET", "/v1/nothing", None, conn)
        return "error", st in (400, 404)
    if x < 0.90:
        path = rng.choice(["/health", "/metrics", "/v1/models", "/version"])
        st, _ = srv.request("GET", path, None, conn)
        return "probe", st == 200
    return "dropped", drop_stream(srv.port, rng.randint(20, 200))


def run_load(srv, seconds, rate, threads, samples, counts, errors):
    stop_at = time.time() + seconds
    pid = srv.proc.pid
    period = threads / rate

    def worker(i):
        rng = random.Random(1000 + i)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
        next_t = time.time() + rng.random() * period
        while time.time() < stop_at:
            time.sleep(max(0.0, next_t - time.time()))
            next_t += period
            try:
                kind, ok = one_request(srv, conn, rng)
            except (OSError, http.client.HTTPException) as e:
                kind, ok = "exception", False
                errors.append(repr(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
            counts[kind] = counts.get(kind, 0) + 1
            if not ok and kind != "exception":
                errors.append(kind)
        conn.close()

    ths = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in ths:
        t.start()
    every = 5.0 if seconds >= 300 else 1.0
    t0 = time.time()
    while any(t.is_alive() for t in ths):
        samples.append((time.time() - t0, rss_kib(pid)))
        time.sleep(every)
    for t in ths:
        t.join()
    samples.append((time.time() - t0, rss_kib(pid)))


def settle(srv, fds0, timeout=60):
    """Waits for no running or waiting request, no KV in use, fds back; returns whether they came back."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = srv.metrics()
        if (m.get("duoserve:num_requests_running", 1) == 0 and m.get("duoserve:num_requests_waiting", 1) == 0
                and m.get('duoserve:kv_cache_usage_perc{pool="full"}', 1) == 0 and n_fds(srv.proc.pid) <= fds0 + 1):
            return True
        time.sleep(0.2)
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260k"),
                    help="model directory ('' for the built-in demo model)")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seconds", type=float, help="the run's length in seconds (overrides --minutes)")
    ap.add_argument("--rate", type=float, default=6.0, help="requests a second, all threads together")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--dropped", type=int, default=1000, help="streams dropped after the load")
    ap.add_argument("--strict", action="store_true", help="exit 1 when an RSS bound is missed")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    ap.add_argument("extra", nargs="*", help="flags for duoserve serve (after --)")
    args = ap.parse_args()
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    model = os.path.normpath(args.model) if args.model else None
    srv = Server(args.bin, model, args.extra)
    pid = srv.proc.pid
    samples, counts, errors = [], {}, []
    rep = {}
    try:
        print(f"soak: {seconds / 60:.1f} min at {args.rate} req/s, pid {pid}, RSS at start {rss_kib(pid) / 1024:.1f} MiB",
              flush=True)
        run_load(srv, seconds, args.rate, args.threads, samples, counts, errors)
        warm = seconds * (0.3 if seconds < 120 else 0.1)
        warm = warm if seconds < 120 else min(max(warm, 60), 300)
        post = [(t, r) for t, r in samples if t >= warm] or samples[-3:]
        first = statistics.median(r for _, r in post[:3])
        last = statistics.median(r for _, r in post[-3:])
        slope = 0.0
        if len(post) >= 3:
            ts = [t for t, _ in post]
            rs = [r for _, r in post]
            mt, mr = statistics.fmean(ts), statistics.fmean(rs)
            den = sum((t - mt) ** 2 for t in ts)
            slope = sum((t - mt) * (r - mr) for t, r in zip(ts, rs)) / den * 60 if den else 0.0
        fds0 = n_fds(pid)
        settle(srv, 10**6, 60)  # the load's last requests end
        fds0 = n_fds(pid)
        time.sleep(1.5)
        before = rss_kib(pid)
        dropped_ok = 0
        lock = threading.Lock()
        todo = list(range(args.dropped))

        def dropper():
            nonlocal dropped_ok
            while True:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                try:
                    ok = drop_stream(srv.port)
                except OSError:
                    ok = False
                with lock:
                    dropped_ok += ok
        ths = [threading.Thread(target=dropper) for _ in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        back = settle(srv, fds0, 120)
        time.sleep(2.5)  # the server gives memory back within a second or two of a large request
        after = rss_kib(pid)
        rep = {
            "minutes": round(seconds / 60, 2), "requests": sum(counts.values()), "by_kind": counts,
            "errors": len(errors), "rss_start_mib": round(samples[0][1] / 1024, 2) if samples else None,
            "rss_after_warmup_mib": round(first / 1024, 2), "rss_end_mib": round(last / 1024, 2),
            "drift_mib": round((last - first) / 1024, 2), "slope_kib_per_min": round(slope, 1),
            "rss_peak_mib": round(max(r for _, r in samples) / 1024, 2),
            "dropped": args.dropped, "dropped_started": dropped_ok, "back_to_baseline": back,
            "rss_before_drops_mib": round(before / 1024, 2), "rss_after_drops_mib": round(after / 1024, 2),
            "drops_delta_mib": round((after - before) / 1024, 2),
        }
    finally:
        rc = srv.stop()
    log = "".join(srv.lines)
    san = [w for w in ("AddressSanitizer", "LeakSanitizer", "runtime error:") if w in log]
    rep.update({"exit": rc, "sanitizer": san})
    rep["drift_ok"] = rep.get("drift_mib", 99) < 4
    rep["drops_ok"] = rep.get("drops_delta_mib", 99) < 8 and rep.get("back_to_baseline", False)
    print(f"soak: {rep.get('requests')} requests ({rep.get('by_kind')}), {rep.get('errors')} unexpected")
    print(f"soak: RSS {rep.get('rss_after_warmup_mib')} MiB after warm-up -> {rep.get('rss_end_mib')} MiB at the end: "
          f"drift {rep.get('drift_mib')} MiB ({rep.get('slope_kib_per_min')} KiB/min; bound 4 MiB)")
    print(f"soak: {args.dropped} dropped streams: RSS {rep.get('rss_before_drops_mib')} -> {rep.get('rss_after_drops_mib')} "
          f"MiB ({rep.get('drops_delta_mib')} MiB; bound 8 MiB), requests/KV/fds back: {rep.get('back_to_baseline')}")
    if errors:
        print("soak: unexpected: " + ", ".join(sorted(set(errors)))[:500])
    if san:
        i = log.find(san[0])
        print("soak: sanitizer report:\n" + log[max(0, i - 300):i + 2000])
    if args.json:
        print(json.dumps(rep))
    bad = errors or san or rc != 0 or not rep.get("back_to_baseline")
    if args.strict and not (rep["drift_ok"] and rep["drops_ok"]):
        bad = True
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
