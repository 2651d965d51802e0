#!/usr/bin/env python3
"""End-to-end tests of scripts/bench_serving.py --multi-turn (Python standard library only).

Each ShareGPT conversation is replayed as a chat session: turn k carries the earlier user turns
and the server's own earlier answers, the turns of a conversation go one after the other and
conversations run side by side within --max-concurrency. Checked on the requests as a server
received them:
  * a scripted chat server on loopback (answers that name the request, first turns slow,
    usage.prompt_tokens_details.cached_tokens and /metrics prefix cache counters, one turn that
    fails): messages, order, concurrency, the first/later TTFT split, both hit rates, a failed
    turn ending its conversation;
  * `duoserve serve` on ../shared/models/stories260k behind a recording proxy: the history is the
    model's real answers, max_completion_tokens the reference answers' token counts, the
    report's counts those of the requests;
  * options that do not go together exit with a message.
Every run is bounded (--max-duration, subprocess timeouts).

usage: tests/e2e_bench_multiturn.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
"""
import argparse
import contextlib
import http.client
import http.server
import json
import math
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


def bench(base_url, *args, timeout=60):
    """Runs bench_serving.py; returns (exit status, stdout, stderr, result JSON or None)."""
    return es.run_script(BENCH, "--base-url", base_url, "--quiet", "--max-duration", "40", "--request-timeout", "20",
                         *args, timeout=timeout)


def sharegpt(tmp, name, convs):
    """Writes conversations given as lists of (human, gpt or None) in ShareGPT's format."""
    data = []
    for i, turns in enumerate(convs):
        c = []
        for h, g in turns:
            if h is not None:
                c.append({"from": "human", "value": h})
            if g is not None:
                c.append({"from": "gpt", "value": g})
        data.append({"id": f"c{i}", "conversations": c})
    path = os.path.join(tmp, name)
    json.dump(data, open(path, "w"))
    return path


def median(xs):
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


class Log:
    """What a server saw: one entry a chat request, in arrival order."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reqs = []  # {"t0", "t1", "body", "answer", "usage", "status"}

    def begin(self, body):
        e = {"t0": time.monotonic(), "t1": None, "body": body, "answer": "", "usage": None, "status": None}
        with self.lock:
            self.reqs.append(e)
        return e

    def done(self, e):
        """The answer is complete: stamped before its last bytes go out, so that a client that
        sends its next turn at once can never be seen sending it before this one ended."""
        with self.lock:
            if e["t1"] is None:
                e["t1"] = time.monotonic()

    def end(self, e):
        with self.lock:
            if e["t1"] is None:
                e["t1"] = time.monotonic()

    def max_in_flight(self):
        """The most requests between their arrival and their answer's end (t1, stamped before the
        answer's last bytes go out: a handler thread that has not yet returned is not counted)."""
        with self.lock:
            ev = sorted([(e["t0"], 1) for e in self.reqs] + [(e["t1"], -1) for e in self.reqs if e["t1"] is not None])
        n = most = 0
        for _, d in ev:  # (an end before a start at the same instant)
            n += d
            most = max(most, n)
        return most


def by_conversation(log):
    """The chat requests grouped by their first user message, each group in arrival order."""
    convs = {}
    for e in log.reqs:
        convs.setdefault(e["body"]["messages"][0]["content"], []).append(e)
    return convs


def check_history(name, log, convs, want_turns):
    """Turn k of each conversation sent the trace's user turns 1..k with the answers the server gave
    to turns 1..k-1 between them, after the answer to turn k-1 had come back."""
    got = by_conversation(log)
    firsts = {turns[0][0]: turns for turns in convs}
    check(f"{name}: the conversations sent are the trace's", set(got) == set(want_turns), (list(got), want_turns))
    bad = []
    for first, reqs in got.items():
        turns = firsts.get(first)
        if turns is None or len(reqs) != want_turns.get(first):
            bad.append((first, "count", len(reqs)))
            continue
        for k, e in enumerate(reqs):
            want = []
            for j in range(k):
                want += [{"role": "user", "content": turns[j][0]}, {"role": "assistant", "content": reqs[j]["answer"]}]
            want.append({"role": "user", "content": turns[k][0]})
            if e["body"]["messages"] != want:
                bad.append((first, k, "messages", e["body"]["messages"], want))
            if k and not (reqs[k - 1]["t1"] is not None and e["t0"] >= reqs[k - 1]["t1"]):
                bad.append((first, k, "sent before the answer to the turn before it ended"))
    check(f"{name}: each turn carries the earlier user turns and the server's own answers, in order", not bad, bad)
    return got


# ----------------------------------------------------------------------------- scripted server


def scripted_server(log, counters):
    """A chat server whose answer names the request ("answer k to <first words>"), whose first
    turns take 0.3 s and later ones 0.02 s, that fails any request whose last message says FAIL,
    and that reports prefix cache hits: every message but the last counts as cached."""

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            with log.lock:
                q, h = counters["queries"], counters["hits"]
            # split over two label sets (as vLLM's engines), plus a _created sample that is no count
            text = ("# TYPE duoserve:prefix_cache_queries_total counter\n"
                    f'duoserve:prefix_cache_queries_total{{engine="0"}} {q - q // 2}\n'
                    f'duoserve:prefix_cache_queries_total{{engine="1"}} {q // 2}\n'
                    'duoserve:prefix_cache_queries_created{engine="0"} 1.7e9\n'
                    f"duoserve:prefix_cache_hits_total {h}\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            e = log.begin(body)
            try:
                self.respond(body, e)
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                log.end(e)

        def respond(self, body, e):
            msgs = body["messages"]
            if "FAIL" in msgs[-1]["content"]:
                e["status"] = 500
                data = json.dumps({"error": {"message": "scripted failure", "type": "server_error"}}).encode()
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            e["status"] = 200
            k = (len(msgs) + 1) // 2
            answer = f"answer {k} to {' '.join(msgs[0]['content'].split()[:3])}"
            prompt = sum(len(m["content"]) for m in msgs)
            cached = sum(len(m["content"]) for m in msgs[:-1])
            with log.lock:
                counters["queries"] += prompt
                counters["hits"] += cached
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()

            def send(obj):
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
            time.sleep(0.3 if k == 1 else 0.02)
            words = answer.split(" ")
            for i, w in enumerate(words):
                send({"choices": [{"index": 0, "delta": {"content": w if i == 0 else " " + w},
                                   "finish_reason": "stop" if i == len(words) - 1 else None}]})
            e["answer"] = answer
            send({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": len(words),
                                           "prompt_tokens_details": {"cached_tokens": cached}}})
            log.done(e)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return H


@contextlib.contextmanager
def scripted(log, counters):
    """The scripted server on a loopback port, for the block: its base URL."""
    srv = es.LoopbackHTTPServer(("127.0.0.1", 0), scripted_server(log, counters))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_scripted(tmp):
    convs = [[("Alpha first question about cats", "a reference answer, not what the server says"),
              ("alpha second", "another reference answer here"), ("alpha third", "a third reference answer"),
              ("alpha fourth, past --max-turns", "never sent")],
             [("Bravo opening line", "reference one is long enough"), ("bravo again", "reference two too")],
             [("Charlie says hello", "the reference answer number one"), ("charlie FAIL now", "reference answer two"),
              ("charlie never", "reference answer three")],
             [("Delta asks once", "only one reference answer")],
             [("Echo begins here", "first reference answer of echo"), ("echo asks, no answer in the trace", None)]]
    path = sharegpt(tmp, "scripted.json", convs)
    log, counters = Log(), {"queries": 0, "hits": 0}
    with scripted(log, counters) as url:
        rc, out, err, r = bench(url, "--model", "scripted", "--dataset", path, "--multi-turn", "--max-turns", "3",
                                "--max-concurrency", "2", "--no-shuffle", "--save-detailed")
        ok = rc == 0 and r is not None
        check("scripted: the run ends with a result", ok, (rc, err[-800:], out[-800:]))
        if not ok:
            return
        # alpha 3 turns (the 4th past --max-turns), bravo 2, charlie 2 (its 2nd fails, the 3rd is not
        # sent), delta 1, echo 1 (its 2nd question has no answer, so no length)
        want_turns = {"Alpha first question about cats": 3, "Bravo opening line": 2, "Charlie says hello": 2,
                      "Delta asks once": 1, "Echo begins here": 1}
        got = check_history("scripted", log, convs, want_turns)
        refs = {a for c in convs for _, a in c if a}
        check("scripted: the trace's answers are never sent back",
              not any(m["content"] in refs for e in log.reqs for m in e["body"]["messages"]), "")
        lens = {t[0]: math.ceil(len(t[1]) / 4) for c in convs for t in c if t[1]}
        check("scripted: max_completion_tokens is the reference answer's length (estimated chars/4)",
              all(e["body"]["max_completion_tokens"] == lens[e["body"]["messages"][-1]["content"]] for e in log.reqs),
              [(e["body"]["messages"][-1]["content"], e["body"]["max_completion_tokens"]) for e in log.reqs])
        check("scripted: the report's counts are the requests'",
              r["conversations"] == 5 and r["turns_planned"] == 10 and r["turns_sent"] == len(log.reqs) == 9
              and r["completed"] == 8 and r["failed"] == 1 and r["turns_not_sent"] == 1 and r["not_sent"] == 1
              and r["conversations_completed"] == 4 and r["turns_ok_first"] == 5 and r["turns_ok_later"] == 3
              and r["max_turns"] == 3, {k: r.get(k) for k in ("conversations", "turns_planned", "turns_sent",
                                                              "completed", "failed", "turns_not_sent",
                                                              "conversations_completed", "turns_ok_first",
                                                              "turns_ok_later")})
        check("scripted: the failing turn's error is reported", "scripted failure" in (r["first_error"] or ""),
              r["first_error"])
        check("scripted: at most --max-concurrency 2 conversations at once, and 2 did overlap",
              log.max_in_flight() == 2, log.max_in_flight())
        first = [t for t, (c, k) in zip(r["ttfts"], r["turns"]) if k == 0]
        later = [t for t, (c, k) in zip(r["ttfts"], r["turns"]) if k > 0]
        check("scripted: TTFT split by turn: the medians are those of the first (0.3 s) and later (0.02 s) turns",
              len(first) == 5 and len(later) == 3 and min(first) >= 0.3 and max(later) < 0.3
              and abs(r["first_turn_median_ttft_ms"] - median(first) * 1000) < 1e-6
              and abs(r["later_turns_median_ttft_ms"] - median(later) * 1000) < 1e-6
              and r["first_turn_p99_ttft_ms"] >= 300 and r["later_turns_p99_ttft_ms"] < 300,
              (first, later, r.get("first_turn_median_ttft_ms"), r.get("later_turns_median_ttft_ms")))
        served = [e["usage"] for e in log.reqs]
        ok_reqs = [e for e in log.reqs if e["status"] == 200]
        want = sum(sum(len(m["content"]) for m in e["body"]["messages"][:-1]) for e in ok_reqs) / \
            sum(sum(len(m["content"]) for m in e["body"]["messages"]) for e in ok_reqs)
        later_reqs = [e for e in ok_reqs if len(e["body"]["messages"]) > 1]
        want_later = sum(sum(len(m["content"]) for m in e["body"]["messages"][:-1]) for e in later_reqs) / \
            sum(sum(len(m["content"]) for m in e["body"]["messages"]) for e in later_reqs)
        check("scripted: hit rate from usage = sum cached_tokens / sum prompt_tokens",
              r["prefix_cache_hit_rate_usage"] is not None and abs(r["prefix_cache_hit_rate_usage"] - want) < 1e-9
              and abs(r["prefix_cache_hit_rate_usage_later_turns"] - want_later) < 1e-9
              and r["answers_with_cached_tokens"] == 8, (r["prefix_cache_hit_rate_usage"], want, served))
        check("scripted: hit rate from /metrics = change of hits / change of queries over the label sets",
              r["prefix_cache_hit_rate_metrics"] is not None and abs(r["prefix_cache_hit_rate_metrics"] - want) < 1e-9
              and r["prefix_cache_counters_delta"] == {"queries": counters["queries"], "hits": counters["hits"]},
              (r["prefix_cache_hit_rate_metrics"], r["prefix_cache_counters_delta"], counters))
        check("scripted: the report prints the multi-turn section",
              re.search(r"^Turns sent: +9 *$", out, re.M)
              and re.search(r"^Median TTFT later turns \(ms\): +[\d.]+", out, re.M)
              and re.search(rf"^Prefix cache hit rate \(/metrics\): +{want:.4f} *$", out, re.M), out[-1500:])
        # --output-len fixes every turn's length, and keeps the unanswered last question of echo
        log.reqs.clear()
        rc, out, err, r = bench(url, "--model", "scripted", "--dataset", path, "--multi-turn", "--output-len", "5",
                                "--num-prompts", "2", "--no-shuffle")
        check("scripted: --output-len 5 and --num-prompts 2: two conversations, all their turns, length 5",
              rc == 0 and r and r["conversations"] == 2 and r["turns_sent"] == len(log.reqs) == 6
              and all(e["body"]["max_completion_tokens"] == 5 for e in log.reqs), (rc, err[-500:], len(log.reqs)))
        got = by_conversation(log)
        check("scripted: --num-prompts counts conversations, in file order with --no-shuffle",
              sorted(got) == ["Alpha first question about cats", "Bravo opening line"], list(got))


def test_context(tmp):
    """--multi-turn-context-len: each conversation opens with a system message of its own (N words,
    the same in each of its turns, another in each conversation), then the turns as without it."""
    convs = [[("Alpha first question about cats", "a reference answer, not what the server says"),
              ("alpha second", "another reference answer here")],
             [("Bravo opening line", "reference one is long enough"), ("bravo again", "reference two too")]]
    path = sharegpt(tmp, "context.json", convs)
    log, counters = Log(), {"queries": 0, "hits": 0}
    with scripted(log, counters) as url:
        ctx = ("--model", "scripted", "--dataset", path, "--multi-turn", "--no-shuffle", "--multi-turn-context-len", "300")
        rc, out, err, r = bench(url, *ctx, "--max-prompt-len", "4000", "--max-total-len", "8000")
        check("context: the run ends with every turn sent", rc == 0 and r and r["turns_sent"] == 4 == len(log.reqs),
              (rc, err[-800:], len(log.reqs)))
        docs = {}
        bad = []
        for e in log.reqs:
            m = e["body"]["messages"]
            if m[0]["role"] != "system" or m[1]["role"] != "user":
                bad.append(("roles", [x["role"] for x in m]))
                continue
            docs.setdefault(m[1]["content"], set()).add(m[0]["content"])
        words = [len(d.split()) for ds in docs.values() for d in ds]
        check("context: a system message first, one document a conversation (in each of its turns), "
              "two conversations, two documents of 300 words (and their title)",
              not bad and sorted(docs) == ["Alpha first question about cats", "Bravo opening line"]
              and all(len(ds) == 1 for ds in docs.values()) and len({d for ds in docs.values() for d in ds}) == 2
              and words == [302, 302], (bad, {k: len(v) for k, v in docs.items()}, words))
        check("context: the report has the documents' mean length in tokens (chars / 4 without a tokenizer)",
              r and r.get("multi_turn") and re.search(r"^Context document tokens \(mean\): +\d", out, re.M),
              out[-1200:])
        # the same seed and conversation: the same document; another seed: another one
        first = {e["body"]["messages"][0]["content"] for e in log.reqs}
        log.reqs.clear()
        bench(url, *ctx, "--max-prompt-len", "4000", "--max-total-len", "8000")
        again = {e["body"]["messages"][0]["content"] for e in log.reqs}
        log.reqs.clear()
        bench(url, *ctx, "--max-prompt-len", "4000", "--max-total-len", "8000", "--seed", "5")
        other = {e["body"]["messages"][0]["content"] for e in log.reqs}
        check("context: the documents follow --seed", first == again and len(other) == 2 and not (other & first),
              (len(first), len(again), len(other)))
        # the document counts in the filter's history: past --max-prompt-len, no conversation is left
        rc, out, err, r = bench(url, *ctx, "--max-prompt-len", "200")
        check("context: the document counts against --max-prompt-len (both conversations dropped as too long)",
              rc != 0 and "2 prompt too long" in (out + err), (rc, (out + err)[-400:]))


def test_bad_flags(tmp):
    data = sharegpt(tmp, "x.json", [[("hello there, world", "an answer of some length")]])
    csv_path = os.path.join(tmp, "lens.csv")
    with open(csv_path, "w") as f:
        f.write("num_decode_tokens\n8\n")
    for flags, want in ((["--multi-turn", "--backend", "openai"], "openai-chat"),
                        (["--multi-turn", "--backend", "vllm"], "openai-chat"),
                        (["--multi-turn", "--endpoint", "/v1/completions"], "chat/completions"),
                        (["--multi-turn", "--structured-fraction", "0.5"], "--structured-fraction"),
                        (["--multi-turn", "--output-lens-csv", csv_path], "--output-lens-csv"),
                        (["--max-turns", "2"], "needs --multi-turn"),
                        (["--multi-turn-context-len", "10"], "needs --multi-turn"),
                        (["--multi-turn", "--multi-turn-context-len", "-1"], ">= 0"),
                        (["--multi-turn", "--max-turns", "0"], ">= 1")):
        rc, out, err, _ = bench("http://127.0.0.1:9", "--model", "m", "--dataset", data, *flags, timeout=30)
        check(f"bad flags {' '.join(f if f != csv_path else 'FILE' for f in flags)}: exit 2 with a message",
              rc == 2 and want in err, (rc, err[-300:]))
    jsonl = os.path.join(tmp, "x.jsonl")
    with open(jsonl, "w") as f:
        f.write(json.dumps({"prompt": "hello there", "max_tokens": 4}) + "\n")
    rc, out, err, _ = bench("http://127.0.0.1:9", "--model", "m", "--dataset", jsonl, "--multi-turn", timeout=30)
    check("bad flags: --multi-turn on a JSONL dataset fails with a message", rc == 1 and "ShareGPT JSON" in err,
          (rc, err[-300:]))


# ----------------------------------------------------------------------------- duoserve behind a proxy


def recording_proxy(log, upstream_port):
    """Forwards every request to duoserve, streaming the answer through line by line, and logs
    the chat requests with the text and usage the server streamed back."""

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def forward(self, method):
            n = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(n) if n else None
            chat = method == "POST" and self.path.endswith("/chat/completions")
            e = log.begin(json.loads(raw)) if chat else None
            up = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
            try:
                up.request(method, self.path, body=raw,
                           headers={k: v for k, v in self.headers.items() if k.lower() in ("content-type",
                                                                                            "authorization")})
                resp = up.getresponse()
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
                self.send_header("Connection", "close")
                self.end_headers()
                if e:
                    e["status"] = resp.status
                while True:
                    line = resp.readline()
                    if not line:
                        break
                    if e and line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                        obj = json.loads(line[6:])
                        for c in obj.get("choices") or []:
                            e["answer"] += (c.get("delta") or {}).get("content") or ""
                        if obj.get("usage"):
                            e["usage"] = obj["usage"]
                    if e and line.strip() == b"data: [DONE]":
                        log.done(e)
                    self.wfile.write(line)
                    self.wfile.flush()
            finally:
                up.close()
                if e:
                    log.end(e)
            self.close_connection = True

        def do_GET(self):
            self.forward("GET")

        def do_POST(self):
            self.forward("POST")

    return H


def test_duoserve(srv, tmp):
    convs = [[("Once upon a time there was a cat.", "The cat liked to play in the sun."),
              ("What did the cat see?", "It saw a big red ball."),
              ("And then?", "The cat ran after the ball all day."),
              ("The end?", "Yes, the end of the story.")],
             [("Lily went to the park with her mom.", "They saw a dog and a bird."),
              ("What was the dog doing?", "The dog was running fast."),
              ("Was Lily happy?", "Lily was very happy.")],
             [("Tom had a little boat.", "He sailed it on the pond."), ("Did it sink?", "No, it did not sink."),
              ("Who helped Tom?", "His friend Sam helped him.")],
             [("The sun was hot that day.", "Everyone went to the lake."), ("What did they eat?", "They ate cake."),
              ("Then what?", "They swam and played games.")]]
    path = sharegpt(tmp, "stories.json", convs)
    log = Log()
    proxy = es.LoopbackHTTPServer(("127.0.0.1", 0), recording_proxy(log, srv.port))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{proxy.server_address[1]}"
    try:
        rc, out, err, r = bench(url, "--dataset", path, "--multi-turn", "--max-turns", "3", "--server-tokenize",
                                "--ignore-eos", "--max-concurrency", "4", "--max-total-len", "512", "--save-detailed")
        ok = rc == 0 and r is not None and r["completed"] == 12
        check("duoserve: 4 conversations x 3 turns answered", ok, (rc, err[-800:], out[-800:]))
        if not ok:
            return
        want_turns = {c[0][0]: 3 for c in convs}
        check_history("duoserve", log, convs, want_turns)
        refs = {a for c in convs for _, a in c}
        check("duoserve: the history holds the model's answers, not the trace's",
              all(e["answer"] and e["answer"] not in refs for e in log.reqs), [e["answer"] for e in log.reqs])

        def count(text):
            return json.loads(srv.post("/tokenize", {"prompt": text})[1])["count"]

        lens = {h: count(a) for c in convs for h, a in c}
        check("duoserve: max_completion_tokens is the reference answer's token count, and so many came (ignore_eos)",
              all(e["body"]["max_completion_tokens"] == lens[e["body"]["messages"][-1]["content"]]
                  == e["usage"]["completion_tokens"] for e in log.reqs),
              [(e["body"]["max_completion_tokens"], e["usage"]) for e in log.reqs])
        check("duoserve: the report's counts are the requests'",
              r["conversations"] == r["conversations_completed"] == 4 and r["turns_sent"] == len(log.reqs) == 12
              and r["turns_ok_first"] == 4 and r["turns_ok_later"] == 8 and r["turns_not_sent"] == 0
              and r["turns_cut_by_filter"] == 0
              and r["total_input_tokens"] == sum(e["usage"]["prompt_tokens"] for e in log.reqs)
              and r["total_output_tokens"] == sum(e["usage"]["completion_tokens"] for e in log.reqs), r)
        check("duoserve: a later turn's prompt holds the earlier turns (more tokens than the turn before's answer)",
              all(b["usage"]["prompt_tokens"] > a["usage"]["prompt_tokens"] + a["usage"]["completion_tokens"]
                  for reqs in by_conversation(log).values() for a, b in zip(reqs, reqs[1:])),
              [[e["usage"] for e in reqs] for reqs in by_conversation(log).values()])
        cached = [(e["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") for e in log.reqs]
        if any(c is not None for c in cached):
            rs = [(e["usage"]["prompt_tokens"], c) for e, c in zip(log.reqs, cached) if c is not None]
            want = sum(c for _, c in rs) / sum(p for p, _ in rs)
            check("duoserve: hit rate from usage = sum cached_tokens / sum prompt_tokens",
                  abs(r["prefix_cache_hit_rate_usage"] - want) < 1e-9, (r["prefix_cache_hit_rate_usage"], want))
        else:
            check("duoserve: no cached_tokens in usage: hit rate n/a", r["prefix_cache_hit_rate_usage"] is None
                  and re.search(r"^Prefix cache hit rate \(usage\): +n/a *$", out, re.M), out[-800:])
        has_counters = any("prefix_cache_queries" in k for k in srv.metrics())
        check("duoserve: the /metrics hit rate is there exactly when the server has the counters",
              (r["prefix_cache_hit_rate_metrics"] is not None) == has_counters
              and (r["prefix_cache_counters_delta"] is not None) == has_counters,
              (has_counters, r["prefix_cache_hit_rate_metrics"]))
    finally:
        proxy.shutdown()
        proxy.server_close()


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
            for name, fn in (("scripted", test_scripted), ("context", test_context), ("bad_flags", test_bad_flags)):
                if args.k in name:
                    print(f"== {name}")
                    try:
                        fn(tmp)
                    except Exception:  # noqa: BLE001
                        check(f"{name}: ran without an exception", False, traceback.format_exc())
            if args.k in "duoserve" and not os.path.exists(os.path.join(model, "config.json")):
                print(f"  SKIP: {model} not found")
            elif args.k in "duoserve":
                tmpl = os.path.join(tmp, "chat.jinja")
                with open(tmpl, "w") as f:
                    f.write("{% for m in messages %}{{ m['content'] }}{% endfor %}")
                srv = Server(args.bin, model, "--chat-template", tmpl)
                print("== duoserve")
                try:
                    test_duoserve(srv, tmp)
                except Exception:  # noqa: BLE001
                    check("duoserve: ran without an exception", False, traceback.format_exc())
                check("server: SIGTERM exits 0", srv.stop() == 0)
        finally:
            if srv:
                srv.stop(signal.SIGKILL)
    print(f"{len(es.PASS)} passed, {len(es.FAIL)} failed")
    return 1 if es.FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
