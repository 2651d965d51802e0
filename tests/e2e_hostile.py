#!/usr/bin/env python3
"""Hostile input against `duoserve serve` over loopback (issue 29: behind a load balancer).

One section per finding, each failing on the server before its fix:
  smuggling   conflicting Content-Length, Content-Length with Transfer-Encoding, Host missing or
              twice: 400 and the connection closed, on a fresh or a reused connection;
  logs        control characters in logged fields (model name, paths) are escaped in the text log;
  nul         JSON strings keep their NUL bytes: prompts, stop strings, chat content;
  amplify     the work one request may ask for is bounded with a 400 naming the limit
              (prompts x n x max_tokens, x logprobs; /tokenize return_token_strs);
  deadlines   a head or body trickling a byte at a time gets 408 within the deadline; request
              bodies held over --max-buffered-bytes get 503;
  memory      RSS given back after large requests (skipped under AddressSanitizer);
  health      /health says 503 from the moment SIGTERM is sent;
  heavy       large /tokenize requests do not stall other requests' streams;
  queue       16 simultaneous small requests on an idle server with --max-queue 4: no 429;
  transport   the transport's own refusals (505, 431, 414, bad chunk, Content-Length: abc) are
              one OpenAI-shaped answer; one connection over --max-connections gets 503 at once;
              a target's query is not part of its path, which is percent-decoded;
  auth        --api-key "" refused; /metrics does not show the -m path; unknown routes and wrong
              methods say 401 before 404/405; two Authorization headers -> 400;
  keep        what was right stays right: n=1e9 and 100k-deep JSON get 400; dropped streams
              leave KV and fds at baseline; a short soak (scripts/soak.py) with no sanitizer report.
With --long: more trials and larger sizes (1,000 dropped streams, 7 MiB /tokenize bodies, 30
SIGTERM races, a 60 s soak). Every loop is bounded in count and time. Prints "N passed, M failed"; exits 1 on failure.

usage: tests/e2e_hostile.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME] [--long]
"""
import argparse
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

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402
from e2e_server import Server, check, error_shape_ok  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG = False


# ---- raw HTTP ----

def read_all(s, timeout):
    """Everything the server sends until it closes (or timeout); (data, closed)."""
    s.settimeout(timeout)
    data, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return data, False
        except OSError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def read_one(s, timeout=10):
    """One response with a Content-Length body: (status, headers lower-cased, body)."""
    s.settimeout(timeout)
    data, deadline = b"", time.time() + timeout
    while b"\r\n\r\n" not in data and time.time() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines[0].startswith("HTTP/") else 0
    h = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        h[k.strip().lower()] = v.strip()
    n = int(h.get("content-length", "0") or 0)
    while len(body) < n and time.time() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, h, body


def raw(port, payload, timeout=5):
    """Sends payload on a fresh connection; returns (all bytes received, closed by the server)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(payload)
        return read_all(s, timeout)
    finally:
        s.close()


def status_of(data):
    return int(data.split(b" ")[1]) if data.startswith(b"HTTP/") else 0


def body_of(data):
    return data.partition(b"\r\n\r\n")[2]


def post_raw(path, body, extra=b""):
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (path.encode(), len(body), extra, body))


OK_BODY = json.dumps({"prompt": [1], "max_tokens": 1}).encode()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def n_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---- 1. request smuggling ----

def test_smuggling(srv):
    cases = [
        ("two different Content-Length", b"Content-Length: %d\r\nContent-Length: 5\r\n" % len(OK_BODY)),
        ("a list of two lengths", b"Content-Length: %d, 5\r\n" % len(OK_BODY)),
        ("Content-Length and Transfer-Encoding", b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(OK_BODY)),
        ("a space before the colon", b"Content-Length : %d\r\n" % len(OK_BODY)),
    ]
    for name, fields in cases:
        data, closed = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n" + OK_BODY)
        check(f"smuggling: {name} -> 400 with the error shape, connection closed",
              status_of(data) == 400 and error_shape_ok(body_of(data)) and closed, data[:300])
    data, closed = raw(srv.port, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    check("smuggling: HTTP/1.1 without Host -> 400", status_of(data) == 400 and error_shape_ok(body_of(data)), data[:300])
    data, closed = raw(srv.port, b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n")
    check("smuggling: two Host headers -> 400", status_of(data) == 400, data[:300])
    data, _ = raw(srv.port, b"GET /health HTTP/1.0\r\n\r\n")
    check("smuggling: HTTP/1.0 without Host is fine", status_of(data) == 200, data[:300])
    # the same length twice is one length
    data, _ = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(OK_BODY), len(OK_BODY), OK_BODY))
    check("smuggling: the same Content-Length twice is accepted", status_of(data) == 200, data[:300])
    # on a reused connection: the second request is held to the same rules
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        s.sendall(post_raw("/v1/completions", OK_BODY))
        st1, _, _ = read_one(s)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nContent-Length: 5\r\n\r\n%s"
                  % (len(OK_BODY), OK_BODY))
        data, closed = read_all(s, 5)
    finally:
        s.close()
    check("smuggling: on a kept-alive connection too: 200, then 400 and closed",
          st1 == 200 and status_of(data) == 400 and closed, (st1, data[:200], closed))


# ---- 2. log forging ----

def test_logs(binary, model):
    srv = Server(binary, model)
    try:
        n0 = len(srv.lines)
        srv.post("/v1/completions", {"model": "x\n2026-01-01T00:00:00.000Z duoserve: info: FORGED-1", "prompt": [1]})
        srv.post("/v1/completions", {"model": "x\rFORGED-2\x1b[2J", "prompt": [1]})
        srv.post("/v1/completions", {"prompt": [1], "max_tokens": 1, "stop": ["\nFORGED-3"], "request_id": "ok"})
        raw(srv.port, b"GET /v1/models/a%0aFORGED-4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        time.sleep(0.3)
        new = srv.lines[n0:]
        forged = [ln for ln in new if re.match(r"\S+ duoserve: info: FORGED|FORGED", ln)]
        ts = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z duoserve: ")
        check("logs: no forged line; every line starts with a timestamp", not forged and all(ts.match(ln) for ln in new),
              new)
        joined = "".join(new)
        check("logs: the control characters are shown escaped",
              "x\\n2026-01-01" in joined and "\\rFORGED-2\\x1b[2J" in joined and "\r" not in joined.replace("\r\n", ""),
              joined[-800:])
    finally:
        srv.stop()


# ---- 3. NUL bytes ----

def test_nul(srv, binary, model):
    def count(prompt):
        st, data, _ = srv.post("/tokenize", {"prompt": prompt, "add_special_tokens": False})
        return json.loads(data)["count"] if st == 200 else None, data
    full, d1 = count("Once\u0000 upon a time")
    head, _ = count("Once")
    check("nul: a prompt with U+0000 tokenizes past it", full is not None and head is not None and full > head + 2,
          (full, head, d1[:200]))
    st, data, _ = srv.post("/tokenize", {"prompt": "a\u0000b", "add_special_tokens": False})
    toks = json.loads(data)["tokens"] if st == 200 else []
    st2, data2, _ = srv.post("/detokenize", {"tokens": toks})
    check("nul: tokenize + detokenize round-trips the NUL",
          st2 == 200 and json.loads(data2)["prompt"] == "a\u0000b", (toks, data2[:200]))
    # a stop string with a NUL acts as the whole string, never as its part before the NUL
    body = {"prompt": [1], "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    st, data, _ = srv.post("/v1/completions", body)
    text = json.loads(data)["choices"][0]["text"] if st == 200 else ""
    first = text.split()[0] if text.split() else "Once"
    st, data, _ = srv.post("/v1/completions", {**body, "stop": [first + "\u0000zzz"]})
    c = json.loads(data)["choices"][0] if st == 200 else {}
    check("nul: stop string 'WORD\\u0000zzz' does not stop at WORD",
          c.get("finish_reason") == "length" and c.get("text") == text, (first, c))
    st, data, _ = srv.post("/v1/completions", {**body, "stop": ["\u0000"]})
    check("nul: a stop string of one NUL is accepted", st == 200, data[:200])
    # chat content: the rendered prompt keeps the NUL (a template that prints the content)
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    chat = Server(binary, model, "--chat-template", f.name)
    try:
        def chat_count(content):
            st, data, _ = chat.post("/tokenize", {"messages": [{"role": "user", "content": content}]})
            return json.loads(data)["count"] if st == 200 else None
        a, b = chat_count("Once\u0000 upon a time"), chat_count("Once")
        check("nul: chat content keeps what follows a NUL", a is not None and b is not None and a > b + 2, (a, b))
        st, data, _ = chat.post("/tokenize", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "x\u0000y"}, {"type": "text", "text": "z"}]}]})
        toks = json.loads(data)["tokens"] if st == 200 else []
        st2, data2, _ = chat.post("/detokenize", {"tokens": toks})
        check("nul: content parts keep their NULs", st2 == 200 and json.loads(data2)["prompt"] == "[x\u0000y\nz]",
              data2[:200])
    finally:
        chat.stop()
        os.unlink(f.name)


# ---- 4. amplification ----

def test_amplify(srv):
    body = {"prompt": [[1, 2, 3]] * 64, "n": 64, "max_tokens": 128, "logprobs": 20}
    t0 = time.time()
    st, data, _ = srv.post("/v1/completions", body, timeout=30)
    msg = json.loads(data)["error"]["message"] if st == 400 and error_shape_ok(data) else ""
    check("amplify: 64 prompts x n=64 x max_tokens 128 -> 400 at once, naming the limit",
          st == 400 and "max-request-tokens" in msg and "524288" in msg and time.time() - t0 < 5, (st, data[:300]))
    st, data, _ = srv.post("/v1/completions", {"prompt": [[1, 2]] * 4, "n": 2, "max_tokens": 100, "logprobs": 20})
    msg = json.loads(data)["error"]["message"] if st == 400 and error_shape_ok(data) else ""
    check("amplify: 4 x n=2 x 100 tokens x 20 logprobs (16000 entries, limit 10000) -> 400 naming the limit",
          st == 400 and "max-request-logprobs" in msg, (st, data[:300]))
    st, data, _ = srv.post("/v1/completions", {"prompt": [[1, 2]] * 4, "n": 2, "max_tokens": 100, "logprobs": 5})
    check("amplify: within both limits -> 200", st == 200, (st, data[:200]))
    st, data, _ = srv.post("/v1/completions", {"prompt": [1], "n": 1000000000})
    check("amplify: n=1e9 -> 400", st == 400 and error_shape_ok(data), (st, data[:200]))
    # /tokenize: token strings are bounded by the context
    long_text = "Once upon a time " * 400
    st, data, _ = srv.post("/tokenize", {"prompt": long_text, "return_token_strs": True})
    check("amplify: /tokenize return_token_strs past max_model_len -> 400 naming the limit",
          st == 400 and b"return_token_strs" in data and b"max_model_len" in data, (st, data[:300]))
    st, data, _ = srv.post("/tokenize", {"prompt": long_text})
    check("amplify: ... the same prompt without token strings -> 200", st == 200, (st, data[:100]))
    st, data, _ = srv.post("/tokenize", {"prompt": "Once upon a time", "return_token_strs": True})
    j = json.loads(data) if st == 200 else {}
    check("amplify: ... and a short one with token strings -> 200", st == 200 and len(j.get("token_strs") or []) == j.get("count"),
          data[:200])
    # a large non-streamed answer is built without holding the server: health answers meanwhile
    done = {}

    def big():
        done["r"] = srv.post("/v1/completions", {"prompt": [[1]] * 16, "n": 4, "max_tokens": 150, "logprobs": 1,
                                                 "ignore_eos": True}, timeout=120)
    th = threading.Thread(target=big)
    th.start()
    worst = 0.0
    while th.is_alive():
        t = time.time()
        srv.get("/health")
        worst = max(worst, time.time() - t)
        time.sleep(0.02)
    th.join(120)
    st = done.get("r", (0,))[0]
    check("amplify: 64 choices x 150 tokens with logprobs -> 200, /health answered within 0.5 s meanwhile",
          st == 200 and worst < 0.5, (st, worst))


# ---- 5. deadlines and the global buffer cap ----

def trickle(port, head, payload, step_s, limit_s):
    """Sends head at once, then payload one byte every step_s; returns (status, seconds from
    the head until the answer)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=limit_s + 5)
    t0, data = time.time(), b""
    try:
        s.sendall(head)
        s.setblocking(False)
        for i in range(len(payload)):
            if time.time() - t0 > limit_s:
                break
            try:
                s.send(payload[i:i + 1])
            except OSError:
                break
            end = time.time() + step_s
            while time.time() < end:
                try:
                    chunk = s.recv(65536)
                    if not chunk:
                        return status_of(data), time.time() - t0
                    data += chunk
                    if b"\r\n\r\n" in data:
                        return status_of(data), time.time() - t0
                except BlockingIOError:
                    time.sleep(0.02)
                except OSError:
                    return status_of(data), time.time() - t0
    finally:
        s.close()
    return status_of(data), time.time() - t0


def test_deadlines(binary, model):
    srv = Server(binary, model, "--header-timeout", "1", "--body-timeout", "2.5", "--max-request-bytes", "600KiB",
                 "--max-buffered-bytes", "1MiB")
    try:
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
        st, t = trickle(srv.port, b"", head, 0.2, 8)
        check("deadlines: a head sent a byte every 0.2 s -> 408 within ~1 s", st == 408 and 0.8 < t < 3, (st, t))
        body = json.dumps({"prompt": [1], "max_tokens": 1, "pad": "x" * 200}).encode()
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
        st, t = trickle(srv.port, head, body, 0.2, 8)
        check("deadlines: a body sent a byte every 0.2 s -> 408 within ~2.5 s of the head", st == 408 and 2 < t < 5, (st, t))
        # bodies held over --max-buffered-bytes: the second 600 KB upload waits for nobody: 503
        a = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        b = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        try:
            a.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 600000\r\n\r\n" + b"{" * 1000)
            time.sleep(0.2)
            b.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 600000\r\n\r\n")
            stb, _, data = read_one(b, 5)
        finally:
            a.close()
            b.close()
        check("deadlines: an upload past --max-buffered-bytes -> 503 with Retry-After and the error shape",
              stb == 503 and error_shape_ok(data) and b"max-buffered-bytes" in data, (stb, data[:200]))
        time.sleep(0.3)
        st, data, _ = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 1})
        check("deadlines: the budget is back once the upload is gone", st == 200, (st, data[:200]))
        # chunked uploads are counted as they grow
        c = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        d = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        try:
            piece = b"%x\r\n%s\r\n" % (4096, b" " * 4096)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + piece * 140)
            time.sleep(0.5)  # the first is held (unfinished) when the second grows
            d.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + piece * 140)
            std, _, data = read_one(d, 5)
        finally:
            c.close()
            d.close()
        check("deadlines: chunked uploads past the budget -> 503", std == 503, (std, data[:200]))
        check("deadlines: healthy afterwards", srv.get("/health")[0] == 200)
    finally:
        srv.stop()


# ---- 6. memory given back ----

def under_asan(pid):
    with open(f"/proc/{pid}/maps") as f:
        return "libasan" in f.read()


def test_memory(srv):
    pid = srv.proc.pid
    if under_asan(pid):  # its allocator keeps freed blocks in quarantine: RSS says nothing here
        check("memory: skipped under AddressSanitizer", True)
        return
    srv.post("/tokenize", {"prompt": "Once upon a time. " * 1000})
    time.sleep(1.5)
    base = rss_kib(pid)
    peak = base
    for _ in range(6 if LONG else 3):  # 3.6 MB of text each, 900k tokens
        srv.post("/tokenize", {"prompt": "Once upon a time. " * 200000}, timeout=120)
        peak = max(peak, rss_kib(pid))
    time.sleep(2.5)  # the trim runs within a second of the request's end
    after = rss_kib(pid)
    print(f"  info memory: RSS {base / 1024:.1f} MiB before, {peak / 1024:.1f} at most, {after / 1024:.1f} after")
    check("memory: RSS back within 8 MiB of where it was before large /tokenize requests", after - base < 8 * 1024,
          (base, peak, after))


# ---- 7. /health from SIGTERM on ----

def test_health(binary, model):
    trials = 30 if LONG else 4
    late = []
    for i in range(trials):
        srv = Server(binary, model, "--shutdown-timeout", "10")
        try:
            # a stream in flight keeps the server draining (not gone) after the signal
            s1 = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            body = json.dumps({"prompt": [1], "max_tokens": 500, "ignore_eos": True, "stream": True}).encode()
            s1.sendall(post_raw("/v1/completions", body))
            got, deadline = b"", time.time() + 10
            while b"data: " not in got and time.time() < deadline:
                got += s1.recv(4096)
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            req = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            s.sendall(req[:-1])
            time.sleep(0.05)
            os.kill(srv.proc.pid, signal.SIGTERM)
            s.sendall(req[-1:])  # the probe completes after the signal was sent
            st, _, _ = read_one(s, 5)
            s.close()
            s1.close()
            if st != 503:
                late.append((i, st))
        finally:
            srv.stop(signal.SIGKILL)
    check(f"health: a probe completed after SIGTERM gets 503 ({trials} trials)", not late, late)


# ---- 8. heavy work does not stall streams ----

def test_heavy(srv):
    size = (7 << 20) if LONG else (3 << 20)
    text = ("Once upon a time, there was a little girl named Lily. " * (size // 54 + 1))[:size]
    gaps, errors = [], []

    def streamer(i):
        try:
            c = srv.conn(120)
            c.request("POST", "/v1/completions", body=json.dumps({"prompt": [1], "max_tokens": 400, "ignore_eos": True,
                                                                  "stream": True, "temperature": 0}),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            last, worst = time.time(), 0.0
            for _ in range(2000):
                line = r.readline()
                if not line:
                    break
                now = time.time()
                if line.startswith(b"data: "):
                    worst = max(worst, now - last)
                    last = now
                    if line.strip() == b"data: [DONE]":
                        break
            gaps.append(worst)
            c.close()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    def tokenizer():
        try:
            srv.post("/tokenize", {"prompt": text}, timeout=120)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=streamer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    toks = [threading.Thread(target=tokenizer) for _ in range(4)]
    for t in toks:
        t.start()
    for t in threads + toks:
        t.join(180)
    print(f"  info heavy: the longest silence of 8 streams during 4 /tokenize of {size >> 20} MiB: {max(gaps or [0]):.2f} s")
    check("heavy: no stream silent for over 1 s while 4 large /tokenize run", not errors and len(gaps) == 8
          and max(gaps) < 1.0, (errors[:3], gaps))


# ---- 9. no spurious 429 ----

def test_queue(binary, model):
    srv = Server(binary, model, "--max-num-seqs", "64", "--max-queue", "4")
    try:
        for trial in range(3):
            statuses = []
            go = threading.Event()

            def worker():
                go.wait(5)
                try:
                    statuses.append(srv.post("/v1/completions", {"prompt": [1, 2], "max_tokens": 4}, timeout=60)[0])
                except Exception as e:  # noqa: BLE001
                    statuses.append(repr(e))
            threads = [threading.Thread(target=worker) for _ in range(16)]
            for t in threads:
                t.start()
            go.set()
            for t in threads:
                t.join(60)
            if statuses.count(200) != 16:
                break
        check("queue: 16 simultaneous small requests on an idle server (64 seats, queue 4) all 200, 3 times",
              statuses.count(200) == 16, statuses)
    finally:
        srv.stop()


# ---- 11. the transport's own refusals ----

def test_transport(binary, model, srv):
    cases = [
        ("HTTP/2.0", b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        ("a header block over 64 KiB", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 70000 + b"\r\n\r\n", 431),
        ("a target over 8 KiB", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        ("a bad chunk", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
         400),
        ("Content-Length: abc", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
        ("a line without a colon", b"GET /health HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n", 400),
        ("obsolete line folding", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n", 400),
    ]
    for name, payload, want in cases:
        data, closed = raw(srv.port, payload)
        n_status = len(re.findall(rb"HTTP/1\.[01] \d\d\d ", data))
        b = body_of(data)
        check(f"transport: {name} -> {want}, one answer in the error shape, JSON, connection closed",
              status_of(data) == want and n_status == 1 and error_shape_ok(b) and closed
              and b"application/json" in data.partition(b"\r\n\r\n")[0], data[:300])
    # what the old front end did with targets still holds: a query is not part of the path, and
    # the path is percent-decoded (the model id here is a path with slashes)
    st, _, _ = srv.get("/health?probe=1")
    check("transport: /health?probe=1 is /health", st == 200, st)
    enc = "".join(c if c.isalnum() else "%%%02X" % ord(c) for c in srv.model_id)
    st, data, _ = srv.get("/v1/models/" + enc)
    check("transport: /v1/models/ID with ID percent-encoded finds the model", st == 200 and json.loads(data).get("id") == srv.model_id,
          (st, data[:200]))
    for bad in ("/health%zz", "/health%00", "/health%4"):
        data, _ = raw(srv.port, b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % bad.encode())
        check(f"transport: a malformed escape ({bad}) -> 400", status_of(data) == 400 and error_shape_ok(body_of(data)), data[:200])
    # one connection over --max-connections is answered at once
    lim = Server(binary, model, "--max-connections", "4")
    held = []
    try:
        time.sleep(0.3)  # the start-up probes' connections are closed
        for _ in range(4):  # four kept-alive connections, each answered once
            s = socket.create_connection(("127.0.0.1", lim.port), timeout=5)
            held.append(s)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            read_one(s)
        t0 = time.time()
        data, closed = raw(lim.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5)
        check("transport: connection max+1 -> 503 at once, error shape, Retry-After, closed",
              status_of(data) == 503 and error_shape_ok(body_of(data)) and b"Retry-After" in data and closed
              and time.time() - t0 < 2, (data[:300], time.time() - t0))
        for s in held:
            s.close()
        time.sleep(0.3)
        check("transport: served again once connections close", lim.get("/health")[0] == 200)
    finally:
        for s in held:
            s.close()
        lim.stop()


# ---- 12. auth and what an unauthenticated client sees ----

def test_auth(binary, model):
    for args, env, what in ((["--api-key", ""], {}, "--api-key \"\""), ([], {"DUOSERVE_API_KEY": ""}, "DUOSERVE_API_KEY=\"\"")):
        try:
            p = subprocess.run([binary, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", *args],
                               capture_output=True, timeout=20, env={**os.environ, **env})
            rc, err = p.returncode, p.stderr.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            rc, err = "served (still running after 20 s)", (e.stderr or b"").decode("utf-8", "replace")
        check(f"auth: {what} is refused with exit 2 and a message naming it", rc == 2 and "empty" in err, (rc, err[-300:]))
    srv = Server(binary, model, "--api-key", "sk-h")
    try:
        st, data, _ = srv.get("/metrics")
        check("auth: unauthenticated /metrics does not show the -m path", st == 200 and model.encode() not in data
              and os.path.dirname(model).encode() not in data, re.findall(rb'model_name="[^"]*"', data)[:2])
        st, data, _ = srv.get("/v1/nothing")
        check("auth: an unknown route without a key -> 401 (not 404)", st == 401 and error_shape_ok(data), (st, data[:200]))
        st, data, _ = srv.get("/v1/completions")
        check("auth: a wrong method without a key -> 401 (not 405)", st == 401, (st, data[:200]))
        st, data, _ = srv.get("/v1/nothing", {"Authorization": "Bearer sk-h"})
        check("auth: ... with the key -> 404", st == 404, st)
        st, data, _ = srv.request("DELETE", "/health")
        check("auth: the open probes still say 405 to a wrong method", st == 405, st)
        data, _ = raw(srv.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-h\r\n"
                      b"Authorization: Bearer other\r\nConnection: close\r\n\r\n")
        check("auth: two Authorization headers -> 400", status_of(data) == 400 and error_shape_ok(body_of(data)), data[:300])
        check("auth: /health stays open", srv.get("/health")[0] == 200)
    finally:
        srv.stop()


# ---- what was right stays right ----

def test_keep(srv):
    st, data, _ = srv.post("/v1/completions", b"[" * 100000 + b"]" * 100000)
    check("keep: 100k-deep JSON -> 400", st == 400 and error_shape_ok(data), (st, data[:200]))
    pid = srv.proc.pid
    srv.post("/v1/completions", {"prompt": [1], "max_tokens": 2})
    time.sleep(0.3)
    fds0 = n_fds(pid)
    n = 1000 if LONG else 60
    body = json.dumps({"prompt": [1], "max_tokens": 300, "ignore_eos": True, "stream": True}).encode()
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(post_raw("/v1/completions", body))
        got, deadline = b"", time.time() + 10
        while b"data: " not in got and time.time() < deadline:
            got += s.recv(4096)
        s.close()
    ok, mt = False, {}
    deadline = time.time() + 20
    while time.time() < deadline:
        mt = srv.metrics()
        if (mt.get("duoserve:num_requests_running", 1) == 0 and mt.get("duoserve:num_requests_waiting", 1) == 0
                and mt.get('duoserve:kv_cache_usage_perc{pool="full"}', 1) == 0 and n_fds(pid) <= fds0 + 1):
            ok = True
            break
        time.sleep(0.1)
    check(f"keep: {n} dropped streams leave requests, KV and fds at baseline", ok, (mt, fds0, n_fds(pid)))
    check("keep: healthy afterwards", srv.get("/health")[0] == 200)


def test_soak(binary, model):
    secs = "60" if LONG else "8"
    try:
        p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "soak.py"), "--bin", binary, "--model", model,
                            "--seconds", secs, "--dropped", "200" if LONG else "40", "--json"],
                           capture_output=True, timeout=int(secs) + 240)
        out = p.stdout.decode("utf-8", "replace")
        rep = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        rc = p.returncode
    except (subprocess.TimeoutExpired, ValueError) as e:
        rc, rep, out = repr(e), {}, ""
    print(f"  info soak: {rep}")
    check("soak: a short soak runs clean (no errors, no sanitizer report)", rc == 0 and rep.get("errors") == 0
          and not rep.get("sanitizer"), (rc, out[-600:], p.stderr.decode()[-600:] if rc else ""))


def main():
    global LONG
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=es.STORIES260K)
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    ap.add_argument("--long", action="store_true", help="more trials, larger sizes (minutes)")
    args = ap.parse_args()
    LONG = args.long
    model = os.path.abspath(os.path.normpath(args.model))
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"  SKIP: {model} not found")
        print("0 passed, 0 failed")
        return 0
    shared = [("smuggling", test_smuggling), ("amplify", test_amplify), ("memory", test_memory), ("heavy", test_heavy),
              ("transport", None), ("keep", test_keep), ("nul", None)]
    own = [("logs", test_logs), ("deadlines", test_deadlines), ("health", test_health), ("queue", test_queue),
           ("auth", test_auth), ("soak", test_soak)]
    srv = None
    try:
        if any(args.k in n for n, _ in shared):
            srv = Server(args.bin, model, "--max-request-logprobs", "10000", "--http-threads", "4")
            srv.model_id = model
            for name, fn in shared:
                if args.k not in name:
                    continue
                print(f"== {name}")
                try:
                    if name == "transport":
                        test_transport(args.bin, model, srv)
                    elif name == "nul":
                        test_nul(srv, args.bin, model)
                    else:
                        fn(srv)
                except Exception:  # noqa: BLE001
                    check(f"{name}: ran without an exception", False, traceback.format_exc())
            rc = srv.stop()
            check("server: SIGTERM exits 0 after the hostile requests", rc == 0, rc)
        for name, fn in own:
            if args.k in name:
                print(f"== {name}")
                try:
                    fn(args.bin, model)
                except Exception:  # noqa: BLE001
                    check(f"{name}: ran without an exception", False, traceback.format_exc())
    finally:
        if srv:
            srv.stop(signal.SIGKILL)
    print(f"{len(es.PASS)} passed, {len(es.FAIL)} failed")
    return 1 if es.FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
