#!/usr/bin/env python3
"""End-to-end tests of `duoserve serve` over loopback (Python standard library only).

Starts the daemon on 127.0.0.1 with a free port (--port 0; the port is read from its log)
on ../shared/models/stories260k and checks: golden greedy text over /v1/completions,
streamed and not; the OpenAI error table (status, error shape, server still healthy);
client disconnect frees the request; SIGTERM drains in-flight streams and exits 0;
64 concurrent requests get the outputs they get alone; API keys. Every loop is bounded in
count and time. Prints one closing line "N passed, M failed"; exits 1 if anything failed.

usage: tests/e2e_server.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
"""
import argparse
import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# the fixtures (../shared, or $DUO_SHARED) and the model most tests serve
SHARED = os.path.normpath(os.environ.get("DUO_SHARED", os.path.join(ROOT, "..", "shared")))
STORIES260K = os.path.join(SHARED, "models", "stories260k")

PASS, FAIL = [], []


def check(name, cond, detail=""):
    if cond:
        PASS.append(name)
        print(f"  ok   {name}")
    else:
        FAIL.append(name)
        print(f"  FAIL {name}{': ' + str(detail)[:600] if detail else ''}")
    return cond


def run_script(script, *args, timeout=60):
    """Runs a benchmark script (scripts/bench_*.py) with --result-json into a temporary file;
    returns (exit status, stdout, stderr, the result JSON or None)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        p = subprocess.run([sys.executable, script, "--result-json", out, *args], capture_output=True, text=True,
                           timeout=timeout)
        res = json.load(open(out)) if os.path.exists(out) else None
    return p.returncode, p.stdout, p.stderr, res


class LoopbackHTTPServer(http.server.ThreadingHTTPServer):
    """A threaded HTTP server for the tests' scripted servers and proxies. socketserver listens
    with a backlog of 5; a client that opens more connections at once (bench_serving's 16 token
    counters) on a loaded machine, whose accepting thread falls behind, overflows it, and the
    kernel then drops the connections or resets them (SYN cookies failing)."""
    request_queue_size = 128


class Server:
    """One daemon process; stderr is collected by a reader thread."""

    def __init__(self, binary, model, *extra, env=None):
        self.args = [binary, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", *extra]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env={**os.environ, **(env or {})})
        self.lines = []
        self.port = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.time() + 30
        while self.port is None and time.time() < deadline and self.proc.poll() is None:
            time.sleep(0.02)
        if self.port is None:
            raise RuntimeError("server did not report its port: " + "".join(self.lines)[-2000:])
        while time.time() < deadline and self.proc.poll() is None:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not become healthy: " + "".join(self.lines)[-2000:])

    def _read(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m and self.port is None:
                self.port = int(m.group(1))

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = self.conn(timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            if isinstance(body, str):
                body = body.encode()
            h = {"Content-Type": "application/json", **(headers or {})}
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, data, dict(r.getheaders())
        finally:
            c.close()

    def get(self, path, headers=None):
        return self.request("GET", path, headers=headers)

    def post(self, path, body, headers=None, timeout=60):
        return self.request("POST", path, body, headers, timeout)

    def metrics(self):
        st, data, _ = self.get("/metrics")
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                out[re.sub(r'model_name="[^"]*",?', "", k).replace("{}", "")] = float(v)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if not getattr(self, "_scanned", False):  # sanitizer reports (make debug) fail the run
            self._scanned = True
            self._reader.join(5)
            log = "".join(self.lines)
            bad = [w for w in ("runtime error:", "AddressSanitizer", "LeakSanitizer") if w in log]
            check(f"server {' '.join(self.args[5:]) or '(defaults)'}: no sanitizer reports", not bad,
                  log[log.find(bad[0]) - 200:][:1500] if bad else "")
        return self.proc.returncode


def stream(srv, body, headers=None, timeout=60):
    """POSTs a streaming completion; returns (status, list of JSON events, saw_done, comments)."""
    c = srv.conn(timeout)
    c.request("POST", body.pop("_path", "/v1/completions"), body=json.dumps(body),
              headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    events, done, comments = [], False, 0
    if r.status != 200:
        data = r.read()
        c.close()
        return r.status, [json.loads(data)], False, 0
    for _ in range(100000):
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if line.startswith(":"):
            comments += 1
        elif line.startswith("data: "):
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                break
            events.append(json.loads(payload))
    c.close()
    return 200, events, done, comments


def error_shape_ok(data):
    try:
        e = json.loads(data)["error"]
    except Exception:
        return False
    return (isinstance(e.get("message"), str) and e["message"] != "" and isinstance(e.get("type"), str)
            and "param" in e and (e["param"] is None or isinstance(e["param"], str))
            and "code" in e and (e["code"] is None or isinstance(e["code"], str)))


# ---- tests ----

def test_golden(srv, model):
    exp_ids = json.load(open(os.path.join(model, "expected_greedy_ids.json")))["greedy_ids"]
    exp_text = open(os.path.join(model, "expected_greedy.txt")).read()
    n = len(exp_ids)
    body = {"model": srv.model_id, "prompt": [1], "max_tokens": n, "temperature": 0, "ignore_eos": True}
    st, data, _ = srv.post("/v1/completions", body)
    ok = check("golden: non-streamed completion is 200", st == 200, data)
    if not ok:
        return
    resp = json.loads(data)
    text = resp["choices"][0]["text"]
    st2, d2, _ = srv.post("/detokenize", {"tokens": exp_ids})
    golden_text = json.loads(d2)["prompt"] if st2 == 200 else None
    check("golden: text equals the decoded golden ids", text == golden_text, (text[:80], (golden_text or "")[:80]))
    check("golden: text is a prefix of llama2.c's expected text", len(text) > 200 and exp_text.startswith(text), text[:120])
    check("golden: usage counts", resp["usage"] == {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1,
                                             "prompt_tokens_details": {"cached_tokens": 0}},
          resp["usage"])
    check("golden: finish_reason length", resp["choices"][0]["finish_reason"] == "length", resp["choices"][0])
    # ids through logprobs with return_tokens_as_token_ids
    st, data, _ = srv.post("/v1/completions", {**body, "logprobs": 1, "return_tokens_as_token_ids": True})
    lp = json.loads(data)["choices"][0]["logprobs"] if st == 200 else None
    ids = [int(t.split(":")[1]) for t in lp["tokens"]] if lp else None
    check("golden: sampled ids equal the golden ids", ids == exp_ids, (ids or [])[:10])
    if lp:
        check("golden: legacy logprobs shape", len(lp["token_logprobs"]) == n and len(lp["top_logprobs"]) == n
              and len(lp["text_offset"]) == n and all(x <= 0 for x in lp["token_logprobs"])
              and lp["text_offset"] == sorted(lp["text_offset"]), {k: v[:3] for k, v in lp.items()})
    # streamed: the same text, in order, then [DONE]; usage last with include_usage
    st, events, done, _ = stream(srv, {**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [e for e in events if e.get("choices")]
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    check("golden: streamed text equals non-streamed text", st == 200 and streamed == text, streamed[:80])
    check("golden: stream ends with [DONE]", done)
    check("golden: usage chunk last, with empty choices", events and events[-1].get("choices") == []
          and events[-1].get("usage", {}).get("completion_tokens") == n, events[-1] if events else None)
    check("golden: last choice chunk has finish_reason length",
          chunks and chunks[-1]["choices"][0]["finish_reason"] == "length")


def test_features(srv):
    m = srv.model_id
    st, data, _ = srv.get("/v1/models")
    j = json.loads(data) if st == 200 else {}
    check("models: lists the served model", st == 200 and j.get("object") == "list" and j["data"][0]["id"] == m, data)
    st, data, _ = srv.post("/v1/completions", {"model": m, "prompt": ["Once upon a time", "The cat"], "n": 2,
                                                "max_tokens": 8, "temperature": 0})
    j = json.loads(data) if st == 200 else {}
    ch = j.get("choices", [])
    check("completions: 2 prompts x n=2 give 4 indexed choices", st == 200 and [c["index"] for c in ch] == [0, 1, 2, 3], data)
    if len(ch) == 4:
        check("completions: greedy n=2 choices agree", ch[0]["text"] == ch[1]["text"] and ch[2]["text"] == ch[3]["text"])
        check("completions: usage sums prompts and choices", j["usage"]["completion_tokens"] == 32, j["usage"])
    st, data, _ = srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "echo": True})
    check("completions: echo prepends the prompt", st == 200 and json.loads(data)["choices"][0]["text"].startswith("Once upon a time"),
          data)
    st, data, _ = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 60, "temperature": 0, "stop": ["Lily"]})
    c = json.loads(data)["choices"][0] if st == 200 else {}
    check("completions: stop string ends the text before it",
          st == 200 and c.get("finish_reason") == "stop" and "Lily" not in c.get("text", "x") and c.get("stop_reason") == "Lily", c)
    st, data, _ = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 5, "temperature": 0.8, "seed": 7})
    st2, data2, _ = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 5, "temperature": 0.8, "seed": 7})
    check("completions: same seed, same text", st == st2 == 200 and json.loads(data)["choices"][0]["text"] ==
          json.loads(data2)["choices"][0]["text"])
    st, data, _ = srv.post("/tokenize", {"prompt": "Once upon a time"})
    j = json.loads(data) if st == 200 else {}
    check("tokenize: vLLM shape", st == 200 and j.get("count") == len(j.get("tokens", [])) and j.get("max_model_len") == 512
          and j["tokens"][0] == 1, data)
    st2, data2, _ = srv.post("/detokenize", {"tokens": j.get("tokens", [])[1:]})
    check("detokenize: round trip", st2 == 200 and json.loads(data2).get("prompt") == "Once upon a time", data2)
    mt = srv.metrics()
    names = ["duoserve:num_requests_running", "duoserve:num_requests_waiting", 'duoserve:kv_cache_usage_perc{pool="full"}',
             'duoserve:kv_cache_usage_perc{pool="streaming"}', "duoserve:prompt_tokens_total",
             "duoserve:generation_tokens_total", "duoserve:num_preemptions_total",
             'duoserve:request_success_total{finished_reason="length"}',
             "duoserve:time_to_first_token_seconds_count", "duoserve:inter_token_latency_seconds_count",
             "duoserve:e2e_request_latency_seconds_count"]
    missing = [n for n in names if n not in mt]
    check("metrics: every required series is present", not missing, missing)
    check("metrics: counters moved", mt.get("duoserve:generation_tokens_total", 0) > 0
          and mt.get("duoserve:e2e_request_latency_seconds_count", 0) > 0)


def raw_request(port, payload, timeout=10, read_all=True):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(payload)
        data = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if not read_all and b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                m = re.search(rb"Content-Length: (\d+)", head, re.I)
                if m and len(rest) >= int(m.group(1)):
                    break
        return data
    finally:
        s.close()


def parse_raw(data):
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
    return status, body


def test_errors(srv):
    m = srv.model_id
    ok = {"model": m, "prompt": [1], "max_tokens": 2}
    cases = [
        ("invalid JSON", "POST", "/v1/completions", b'{"prompt": [1', 400, None),
        ("body is not an object", "POST", "/v1/completions", b"[1, 2]", 400, None),
        ("empty body", "POST", "/v1/completions", b"", 400, None),
        ("prompt wrong type", "POST", "/v1/completions", {**ok, "prompt": 5}, 400, None),
        ("prompt missing", "POST", "/v1/completions", {"max_tokens": 2}, 400, None),
        ("max_tokens wrong type", "POST", "/v1/completions", {**ok, "max_tokens": "2"}, 400, None),
        ("temperature above 2", "POST", "/v1/completions", {**ok, "temperature": 2.5}, 400, None),
        ("temperature 1e999", "POST", "/v1/completions", b'{"prompt":[1],"temperature":1e999}', 400, None),
        ("temperature -1e999", "POST", "/v1/completions", b'{"prompt":[1],"temperature":-1e999}', 400, None),
        ("max_tokens 1e999", "POST", "/v1/completions", b'{"prompt":[1],"max_tokens":1e999}', 400, None),
        ("top_p 0", "POST", "/v1/completions", {**ok, "top_p": 0}, 400, None),
        ("top_p above 1", "POST", "/v1/completions", {**ok, "top_p": 1.01}, 400, None),
        ("max_tokens 0", "POST", "/v1/completions", {**ok, "max_tokens": 0}, 400, None),
        ("max_tokens 1.5", "POST", "/v1/completions", {**ok, "max_tokens": 1.5}, 400, None),
        ("n 0", "POST", "/v1/completions", {**ok, "n": 0}, 400, None),
        ("n too large", "POST", "/v1/completions", {**ok, "n": 100000}, 400, None),
        ("logprobs 21", "POST", "/v1/completions", {**ok, "logprobs": 21}, 400, None),
        ("logprobs -1", "POST", "/v1/completions", {**ok, "logprobs": -1}, 400, None),
        ("token id outside the vocabulary", "POST", "/v1/completions", {**ok, "prompt": [1, 100000]}, 400, None),
        ("negative token id", "POST", "/v1/completions", {**ok, "prompt": [-1]}, 400, None),
        ("stop_token_ids outside the vocabulary", "POST", "/v1/completions", {**ok, "stop_token_ids": [512]}, 400, None),
        ("logit_bias key not an id", "POST", "/v1/completions", {**ok, "logit_bias": {"x": 1}}, 400, None),
        ("logit_bias value out of range", "POST", "/v1/completions", {**ok, "logit_bias": {"5": 101}}, 400, None),
        ("invalid UTF-8", "POST", "/v1/completions", b'{"prompt":"\xff\xfe abc","max_tokens":2}', 400, None),
        ("lone surrogate escape", "POST", "/v1/completions", b'{"prompt":"\\udc00","max_tokens":2}', 400, None),
        ("deeply nested JSON", "POST", "/v1/completions", b"[" * 20000 + b"]" * 20000, 400, None),
        ("deeply nested object", "POST", "/v1/completions", b'{"a":' * 5000 + b"1" + b"}" * 5000, 400, None),
        ("prompt + max_tokens over the context", "POST", "/v1/completions", {**ok, "max_tokens": 100000}, 400,
         "context_length_exceeded"),
        ("prompt alone over the context", "POST", "/v1/completions", {**ok, "prompt": [1] * 600}, 400,
         "context_length_exceeded"),
        ("stream_options without stream", "POST", "/v1/completions", {**ok, "stream_options": {"include_usage": True}}, 400, None),
        ("unknown model", "POST", "/v1/completions", {**ok, "model": "no-such-model"}, 404, "model_not_found"),
        ("unknown route", "GET", "/v1/nothing", None, 404, None),
        ("wrong method on completions", "GET", "/v1/completions", None, 405, None),
        ("wrong method on health", "POST", "/health", b"{}", 405, None),
        ("chat on a model without a template", "POST", "/v1/chat/completions",
         {"model": m, "messages": [{"role": "user", "content": "hi"}]}, 400, None),
        ("chat messages wrong type", "POST", "/v1/chat/completions", {"model": m, "messages": "hi"}, 400, None),
        ("chat image content", "POST", "/v1/chat/completions",
         {"model": m, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, None),
        ("detokenize id outside the vocabulary", "POST", "/detokenize", {"tokens": [99999]}, 400, None),
        ("tokenize without prompt", "POST", "/tokenize", {}, 400, None),
    ]
    for name, method, path, body, status, code in cases:
        try:
            st, data, _ = srv.request(method, path, body)
        except Exception as e:  # noqa: BLE001
            st, data = 0, str(e).encode()
        good = st == status and error_shape_ok(data)
        if good and code:
            good = json.loads(data)["error"]["code"] == code
        check(f"error: {name} -> {status}", good, (st, data[:300]))
    # 413: over --max-request-bytes (the server runs with 65536)
    big = json.dumps({"prompt": "a" * 70000, "max_tokens": 1})
    st, data, _ = srv.post("/v1/completions", big)
    check("error: body over --max-request-bytes -> 413", st == 413 and error_shape_ok(data), (st, data[:200]))
    # 413 for a chunked body (no Content-Length)
    payload = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (8192, b"a" * 8192) for _ in range(10)) + b"0\r\n\r\n")
    st, body = parse_raw(raw_request(srv.port, payload))
    check("error: chunked body over the limit -> 413", st == 413, (st, body[:200]))
    st, data, _ = srv.get("/health")
    check("error: server still healthy after the error table", st == 200)
    st, data, _ = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 3, "temperature": 0})
    check("error: server still serves completions after the error table", st == 200, data)


def test_disconnect(srv):
    before = srv.metrics()
    n_lines = len(srv.lines)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    body = json.dumps({"prompt": [1], "max_tokens": 500, "temperature": 0, "ignore_eos": True, "stream": True})
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
              % (len(body), body.encode()))
    got = b""
    deadline = time.time() + 10
    while b"data: " not in got and time.time() < deadline:
        got += s.recv(4096)
    s.close()
    check("disconnect: the stream had started", b"data: " in got, got[:200])
    ok, mt = False, {}
    deadline = time.time() + 15
    while time.time() < deadline:
        mt = srv.metrics()
        if (mt.get("duoserve:num_requests_running", 1) == 0 and mt.get("duoserve:num_requests_waiting", 1) == 0
                and mt.get('duoserve:kv_cache_usage_perc{pool="full"}', 1) == 0):
            ok = True
            break
        time.sleep(0.05)
    check("disconnect: running/waiting and KV usage return to 0", ok, mt)
    deadline = time.time() + 5
    gone = []
    while not gone and time.time() < deadline:
        gone = [ln for ln in srv.lines[n_lines:] if "POST /v1/completions" in ln]
        time.sleep(0.05)
    check("disconnect: the access log says 499, client disconnected",
          gone and " 499 " in gone[0] and "client disconnected" in gone[0], gone)
    k = 'duoserve:request_success_total{finished_reason="abort"}'
    print(f"  info disconnect: aborted sequences {before.get(k, 0):.0f} -> {mt.get(k, 0):.0f}")
    st, _, _ = srv.get("/health")
    check("disconnect: server still healthy", st == 200)


def test_concurrent(srv):
    prompts = ["Once upon a time", "The little dog", "Lily and Tom", "One day", "The sun was", "A big red ball",
               "Tim wanted to", "Mom said"]
    bodies = []
    for i, p in enumerate(prompts):
        b = {"prompt": p, "max_tokens": 24 + i, "temperature": 0}
        if i % 3 == 1:
            b.update(temperature=0.9, seed=100 + i)
        bodies.append(b)
    alone = []
    for b in bodies:
        st, data, _ = srv.post("/v1/completions", b)
        alone.append(json.loads(data)["choices"][0]["text"] if st == 200 else None)
    check("concurrent: reference outputs computed alone", all(a is not None for a in alone))
    results = [None] * 64
    errors = []

    def worker(i):
        try:
            b = dict(bodies[i % len(bodies)])
            if i % 2:
                st, events, done, _ = stream(srv, {**b, "stream": True}, timeout=120)
                results[i] = "".join(e["choices"][0]["text"] for e in events if e.get("choices")) if st == 200 and done else None
            else:
                st, data, _ = srv.post("/v1/completions", b, timeout=120)
                results[i] = json.loads(data)["choices"][0]["text"] if st == 200 else None
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    bad = [i for i in range(64) if results[i] is None]
    check("concurrent: 64 requests all succeed", not bad and not errors, (bad[:8], errors[:3]))
    diff = [i for i in range(64) if results[i] is not None and results[i] != alone[i % len(bodies)]]
    check("concurrent: each output equals the output alone", not diff,
          [(i, results[i][:40], alone[i % len(bodies)][:40]) for i in diff[:3]])
    print(f"  info concurrent: 64 requests in {time.time() - t0:.2f}s")


def test_api_key(binary, model):
    srv = Server(binary, model, "--api-key", "sk-test-123")
    try:
        srv.model_id = model
        st, data, h = srv.get("/v1/models")
        check("api key: missing key -> 401 with error shape", st == 401 and error_shape_ok(data), (st, data))
        st, data, _ = srv.get("/v1/models", {"Authorization": "Bearer sk-test-124"})
        check("api key: wrong key -> 401", st == 401 and error_shape_ok(data), st)
        st, data, _ = srv.get("/v1/models", {"Authorization": "Bearer sk-test-12"})
        check("api key: prefix of the key -> 401", st == 401, st)
        st, data, _ = srv.get("/v1/models", {"Authorization": "Bearer sk-test-123"})
        check("api key: right key -> 200", st == 200, (st, data))
        st, data, _ = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 2}, {"Authorization": "Bearer sk-test-123"})
        check("api key: completion with the key -> 200", st == 200, (st, data))
        check("api key: /health stays open", srv.get("/health")[0] == 200)
        check("api key: /metrics stays open", srv.get("/metrics")[0] == 200)
        # Checked before the body is read: the 401 comes back although the body never does.
        payload = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        st, body = parse_raw(raw_request(srv.port, payload, timeout=5, read_all=False))
        check("api key: 401 before the body is sent", st == 401, (st, body[:200]))
    finally:
        srv.stop()


def test_queue_full(binary, model):
    srv = Server(binary, model, "--max-num-seqs", "1", "--max-queue", "1")
    try:
        statuses, retry = [], []

        def worker():
            try:
                st, data, h = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 300, "ignore_eos": True,
                                                           "temperature": 0}, timeout=120)
                statuses.append(st)
                if st == 429:
                    retry.append(h.get("Retry-After") is not None and error_shape_ok(data))
            except Exception as e:  # noqa: BLE001
                statuses.append(repr(e))

        threads = [threading.Thread(target=worker) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        check("queue full: some requests get 429", statuses.count(429) > 0, statuses)
        check("queue full: 429 has Retry-After and the error shape", retry and all(retry), retry)
        check("queue full: the others succeed", all(s in (200, 429) for s in statuses) and statuses.count(200) >= 1, statuses)
        check("queue full: healthy afterwards", srv.get("/health")[0] == 200)
    finally:
        srv.stop()


def test_drain(binary, model):
    srv = Server(binary, model, "--max-num-seqs", "1", "--sse-keepalive", "0.1", "--shutdown-timeout", "60")
    results = {}

    def worker(i):
        try:
            results[i] = stream(srv, {"prompt": [1], "max_tokens": 499, "ignore_eos": True, "temperature": 0,
                                      "stream": True}, timeout=120)
        except Exception as e:  # noqa: BLE001
            results[i] = repr(e)

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.time() + 20
        while time.time() < deadline:  # all four admitted to the engine (one running, three queued), tokens flowing
            mt = srv.metrics()
            if (mt.get("duoserve:generation_tokens_total", 0) >= 1 and
                    mt.get("duoserve:num_requests_running", 0) + mt.get("duoserve:num_requests_waiting", 0) >= 4):
                break
            time.sleep(0.01)
        srv.proc.send_signal(signal.SIGTERM)
        st_h, st_new = None, None
        deadline = time.time() + 5
        while time.time() < deadline and st_h != 503:
            try:
                st_h = srv.get("/health")[0]
            except OSError as e:
                st_h = repr(e)
                break
        try:
            st_new, data, _ = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 2})
        except OSError as e:
            st_new = repr(e)
        check("drain: /health says 503 while draining", st_h == 503, st_h)
        check("drain: new requests get 503 while draining", st_new == 503, st_new)
        for t in threads:
            t.join(120)
        good = [i for i, r in results.items() if isinstance(r, tuple) and r[0] == 200 and r[2]
                and sum(1 for e in r[1] if e.get("choices") and e["choices"][0].get("finish_reason") == "length") == 1]
        check("drain: every in-flight stream ran to [DONE] with finish_reason length", len(good) == 4,
              {i: (r if isinstance(r, str) else (r[0], len(r[1]), r[2])) for i, r in results.items()})
        try:
            rc = srv.proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = "still running"
        check("drain: exits 0 after draining", rc == 0, rc)
        comments = sum(r[3] for r in results.values() if isinstance(r, tuple))
        print(f"  info drain: {comments} keep-alive comment(s) seen on queued streams")
    finally:
        srv.stop(signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=STORIES260K)
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    model = os.path.normpath(args.model)
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"  SKIP: {model} not found")
        print("0 passed, 0 failed")
        return 0
    tests_main = [("golden", test_golden), ("features", test_features), ("errors", test_errors),
                  ("disconnect", test_disconnect), ("concurrent", test_concurrent)]
    tests_own = [("api_key", test_api_key), ("queue_full", test_queue_full), ("drain", test_drain)]
    srv = None
    try:
        if any(args.k in n for n, _ in tests_main):
            srv = Server(args.bin, model, "--max-request-bytes", "65536")
            srv.model_id = model
            for name, fn in tests_main:
                if args.k in name:
                    print(f"== {name}")
                    try:
                        fn(srv, model) if fn is test_golden else fn(srv)
                    except Exception:  # noqa: BLE001
                        check(f"{name}: ran without an exception", False, traceback.format_exc())
            rc = srv.stop()
            check("server: SIGTERM with nothing in flight exits 0", rc == 0, rc)
            log = "".join(srv.lines)
            check("server: one log line per request", log.count(" request ") >= 20, log[-500:])
        for name, fn in tests_own:
            if args.k in name:
                print(f"== {name}")
                try:
                    fn(args.bin, model)
                except Exception:  # noqa: BLE001
                    check(f"{name}: ran without an exception", False, traceback.format_exc())
    finally:
        if srv:
            srv.stop(signal.SIGKILL)
    print(f"{len(PASS)} passed, {len(FAIL)} failed")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
