#!/usr/bin/env python3
"""End-to-end tests of duoserve's HTTP layer over loopback (Python standard library only).

A port held by another duoserve (or any program) is refused with exit 1; bodies over
--max-request-bytes get a readable 413 (also to Expect: 100-continue, before the body);
request fields the server does not implement are refused with a 400 naming them; X-Request-Id
is echoed (and names the completion); CORS preflights and headers (--allowed-origins ...);
/version and /ping; system_fingerprint in completions and stream chunks. Every loop is bounded
in count and time. Prints one closing line "N passed, M failed"; exits 1 if anything failed.

usage: tests/e2e_http.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
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
import time
import traceback

sys.dont_write_bytecode = True  # importing e2e_server must not leave tests/__pycache__ behind
from e2e_server import FAIL, PASS, ROOT, Server, check, error_shape_ok, STORIES260K, stream

LIMIT = 65536  # --max-request-bytes of the shared server


def read_response(sock, timeout=10):
    """Reads one HTTP response (status line, headers, Content-Length body) from sock.
    Returns (status, headers dict with lower-case names, body bytes); raises on a reset."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.time() + timeout
    while b"\r\n\r\n" not in data and time.time() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines[0].startswith("HTTP/") else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(body) < n and time.time() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


# ---- a port in use ----

def test_port_in_use(binary, model):
    srv = Server(binary, model)
    try:
        t0 = time.time()
        try:
            p = subprocess.run([binary, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(srv.port)],
                               capture_output=True, timeout=20)
            rc, err = p.returncode, p.stderr.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            rc, err = "still running after 20 s", (e.stderr or b"").decode("utf-8", "replace")
        check("port: a second duoserve on a port a duoserve holds exits 1", rc == 1, (rc, err[-400:]))
        check("port: ... saying 'address in use'", re.search(r"address (already )?in use", err, re.I) is not None, err[-400:])
        check("port: ... without ever saying ready", "ready" not in err and time.time() - t0 < 20, err[-400:])
        st, data, _ = srv.get("/health")
        check("port: the first server still serves", st == 200, st)
    finally:
        srv.stop()
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        p = subprocess.run([binary, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(holder.getsockname()[1])],
                           capture_output=True, timeout=20)
        err = p.stderr.decode("utf-8", "replace")
        check("port: a port another program holds: exit 1, 'address in use'",
              p.returncode == 1 and re.search(r"address (already )?in use", err, re.I) is not None, (p.returncode, err[-400:]))
    finally:
        holder.close()


# ---- bodies over --max-request-bytes ----

def big_request(path, n, extra=b""):
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (path.encode(), n, extra))


def test_too_large(srv):
    for size, what in ((2 * LIMIT, "2x the limit"), (8 << 20, "8 MiB")):
        body = b'{"prompt": "' + b"a" * (size - 30) + b'", "max_tokens": 1}'
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
        try:
            s.sendall(big_request("/v1/completions", len(body)) + body)  # all of it before reading, as SDKs do
            st, h, data = read_response(s)
            err = None
        except OSError as e:  # BrokenPipeError, ConnectionResetError: what this test is about
            st, h, data, err = 0, {}, b"", repr(e)
        finally:
            s.close()
        check(f"413: a body of {what} sent in full gets a complete 413 (no broken pipe or reset)",
              st == 413 and err is None and len(data) == int(h.get("content-length", -1)), (st, err, data[:200]))
        check(f"413: ... with the OpenAI error shape and code request_too_large ({what})",
              error_shape_ok(data) and json.loads(data)["error"]["code"] == "request_too_large", data[:200])

    # Expect: 100-continue: the 413 comes before the body is sent (and no "100 Continue").
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        s.sendall(big_request("/v1/completions", 10 * LIMIT, b"Expect: 100-continue\r\n"))
        st, h, data = read_response(s, timeout=5)
    finally:
        s.close()
    check("413: Expect: 100-continue with a Content-Length over the limit gets 413 up front",
          st == 413 and error_shape_ok(data), (st, data[:200]))
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        body = b'{"prompt": [1], "max_tokens": 2}'
        s.sendall(big_request("/v1/completions", len(body), b"Expect: 100-continue\r\n"))
        st, _, _ = read_response(s, timeout=5)
        if st == 100:
            s.sendall(body)
            st, _, _ = read_response(s, timeout=10)
    finally:
        s.close()
    check("413: Expect: 100-continue within the limit still gets 100 Continue, then 200", st == 200, st)

    # A chunked body over the limit, sent whole, then a request on the same connection.
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + b"".join(b"%x\r\n%s\r\n" % (8192, b"a" * 8192) for _ in range(4 * LIMIT // 8192)) + b"0\r\n\r\n")
        st, _, data = read_response(s)
        ok = b'{"prompt": [1], "max_tokens": 2}'
        s.sendall(big_request("/v1/completions", len(ok)) + ok)
        st2, _, _ = read_response(s)
        err = None
    except OSError as e:
        st, st2, data, err = 0, 0, b"", repr(e)
    finally:
        s.close()
    check("413: a chunked body over the limit sent in full gets a readable 413", st == 413 and error_shape_ok(data), (st, err))
    check("413: ... and the connection serves the next request", st2 == 200, (st2, err))
    check("413: server healthy afterwards", srv.get("/health")[0] == 200)


# ---- fields that would change the output ----

def test_fields(srv):
    m = srv.model_id
    ok = {"model": m, "prompt": [1], "max_tokens": 2, "temperature": 0}
    refused = [
        ("guided_regex", "a+"), ("guided_choice", ["a", "b"]),
        ("guided_grammar", "root ::= 'a'"), ("structured_outputs", {"regex": "a+"}), ("logits_processors", ["x"]),
        ("prompt_logprobs", 1), ("suffix", "end"),
        ("use_beam_search", True), ("allowed_token_ids", [1, 2]), ("bad_words", ["a"]), ("truncate_prompt_tokens", 4),
    ]
    for name, value in refused:
        st, data, _ = srv.post("/v1/completions", {**ok, name: value})
        e = json.loads(data).get("error", {}) if error_shape_ok(data) else {}
        check(f"fields: completions '{name}' -> 400 naming it", st == 400 and e.get("param") == name, (st, data[:200]))
    st, data, _ = srv.post("/v1/completions", {**ok, "best_of": 2})
    check("fields: best_of > n -> 400 naming it", st == 400 and json.loads(data)["error"]["param"] == "best_of", data[:200])
    st, data, _ = srv.post("/v1/completions", {**ok, "temprature": 0.5})
    e = json.loads(data).get("error", {}) if st == 400 else {}
    check("fields: an unknown field (a misspelt temperature) -> 400 naming it",
          e.get("param") == "temprature" and "temprature" in e.get("message", ""), (st, data[:200]))
    st, data, _ = srv.post("/v1/completions", {**ok, "stream": True, "stream_options": {"continuous_usage_stats": True}})
    check("fields: stream_options.continuous_usage_stats -> 400 naming it",
          st == 400 and json.loads(data)["error"]["param"] == "stream_options.continuous_usage_stats", data[:200])
    accepted = {"user": "u", "metadata": {"k": "v"}, "store": False, "service_tier": "auto", "use_beam_search": False,
                "response_format": {"type": "text"}, "guided_json": None, "priority": 0, "cache_salt": "s"}
    st, data, _ = srv.post("/v1/completions", {**ok, **accepted})
    st0, data0, _ = srv.post("/v1/completions", ok)
    same = st == st0 == 200 and json.loads(data)["choices"][0]["text"] == json.loads(data0)["choices"][0]["text"]
    check("fields: fields without effect (user, metadata, store, use_beam_search false, ...) -> 200, same text", same,
          (st, data[:200]))
    chat = {"model": m, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for name, value in (("tools", [{"type": "retrieval"}]), ("tool_choice", "required"),
                        ("guided_json", 3), ("response_format", {"type": "json_schema"}), ("reasoning_effort", "low")):
        st, data, _ = srv.post("/v1/chat/completions", {**chat, name: value})
        e = json.loads(data).get("error", {}) if error_shape_ok(data) else {}
        check(f"fields: chat '{name}' -> 400 naming it", st == 400 and e.get("param") == name, (st, data[:200]))
    # This model has no chat template: a request whose fields all pass fails on "messages" instead.
    st, data, _ = srv.post("/v1/chat/completions", {**chat, "tools": [], "tool_choice": "none", "store": True,
                                                      "parallel_tool_calls": False, "max_completion_tokens": 2})
    check("fields: chat fields without effect pass the check (then: no chat template, param messages)",
          st == 400 and json.loads(data)["error"]["param"] == "messages", data[:200])
    st, data, _ = srv.post("/tokenize", {"prompt": "hi", "chat_template": "x"})
    check("fields: /tokenize refuses chat_template", st == 400 and json.loads(data)["error"]["param"] == "chat_template",
          data[:200])
    st, data, _ = srv.post("/detokenize", {"tokens": [5], "prompt": "x"})
    check("fields: /detokenize refuses an unknown field", st == 400 and json.loads(data)["error"]["param"] == "prompt",
          data[:200])


# ---- X-Request-Id ----

def test_request_id(srv):
    ok = {"prompt": [1], "max_tokens": 3, "temperature": 0}
    st, data, h = srv.post("/v1/completions", ok, {"X-Request-Id": "trace-42"})
    check("request id: echoed on a completion", st == 200 and h.get("X-Request-Id") == "trace-42", h)
    check("request id: names the completion (cmpl-<id>, as vLLM)", st == 200 and json.loads(data)["id"] == "cmpl-trace-42",
          data[:200])
    c = srv.conn()
    c.request("POST", "/v1/completions", body=json.dumps({**ok, "stream": True, "stream_options": {"include_usage": True}}),
              headers={"Content-Type": "application/json", "X-Request-Id": "stream-7"})
    r = c.getresponse()
    hdr = r.getheader("X-Request-Id")
    events = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: {")]
    c.close()
    check("request id: echoed on a stream", hdr == "stream-7", hdr)
    check("request id: every chunk's id is cmpl-<id>", events and all(e["id"] == "cmpl-stream-7" for e in events),
          [e.get("id") for e in events][:3])
    st, data, h = srv.post("/v1/completions", ok)
    check("request id: without one, the completion id is the header", st == 200 and h.get("X-Request-Id") == json.loads(data)["id"],
          (h.get("X-Request-Id"), data[:100]))
    st, data, h = srv.post("/v1/completions", {**ok, "request_id": "body-9"})
    check("request id: the body's request_id names the completion", st == 200 and json.loads(data)["id"] == "cmpl-body-9",
          data[:200])
    ids = set()
    for path in ("/health", "/v1/models", "/version", "/nothing"):
        st, _, h = srv.get(path, {"X-Request-Id": "r-" + path.strip("/")})
        check(f"request id: echoed on GET {path} ({st})", h.get("X-Request-Id") == "r-" + path.strip("/"), h)
        st, _, h = srv.get(path)
        ids.add(h.get("X-Request-Id"))
    check("request id: generated (and distinct) when not given", None not in ids and len(ids) == 4, ids)
    st, data, h = srv.post("/v1/completions", {**ok, "temperature": 9}, {"X-Request-Id": "bad-1"})
    check("request id: echoed on an error", st == 400 and h.get("X-Request-Id") == "bad-1", h)
    st, data, h = srv.post("/v1/completions", ok, {"X-Request-Id": "x" * 129})
    check("request id: longer than 128 -> 400", st == 400 and error_shape_ok(data) and "X-Request-Id" in data.decode(), data[:200])


# ---- system_fingerprint ----

def test_fingerprint(srv, binary):
    # "duoserve 0.1.0 (git HASH; CUDA: ...)"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.split()[1]
    ok = {"prompt": [1], "max_tokens": 3, "temperature": 0}
    fps = []
    for _ in range(2):
        st, data, _ = srv.post("/v1/completions", ok)
        fps.append(json.loads(data).get("system_fingerprint") if st == 200 else None)
    check("fingerprint: in completions, duoserve-<version>-<hash>",
          fps[0] is not None and re.fullmatch(rf"duoserve-{re.escape(version)}-[0-9a-f]{{8}}", fps[0]) is not None, fps)
    check("fingerprint: the same for every request", fps[0] == fps[1], fps)
    st, events, done, _ = stream(srv, {**ok, "stream": True, "stream_options": {"include_usage": True}})
    check("fingerprint: in every stream chunk, the usage chunk too",
          st == 200 and done and events and all(e.get("system_fingerprint") == fps[0] for e in events),
          [e.get("system_fingerprint") for e in events][:4])


# ---- /version and /ping ----

def test_version_ping(binary, model):
    # "duoserve 0.1.0 (git HASH; CUDA: ...)"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.split()[1]
    srv = Server(binary, model, "--api-key", "sk-vp")
    try:
        st, data, _ = srv.get("/version")
        check("version: GET /version -> {\"version\": ...} without an API key",
              st == 200 and json.loads(data) == {"version": version}, (st, data))
        for method in ("GET", "POST"):
            st, data, _ = srv.request(method, "/ping", b"" if method == "POST" else None)
            check(f"ping: {method} /ping -> 200 like /health, without an API key", st == 200, (st, data))
        st, data, h = srv.request("DELETE", "/ping")
        check("ping: DELETE /ping -> 405 with Allow", st == 405 and "POST" in h.get("Allow", ""), (st, h))
        st, data, h = srv.request("POST", "/version", b"{}")
        check("version: POST /version -> 405", st == 405 and h.get("Allow") == "GET, HEAD", (st, h))
    finally:
        srv.stop()


# ---- CORS ----

def preflight(srv, origin, method="POST", req_headers="content-type", path="/v1/completions"):
    h = {"Origin": origin, "Access-Control-Request-Method": method}
    if req_headers:
        h["Access-Control-Request-Headers"] = req_headers
    return srv.request("OPTIONS", path, None, h)


def test_cors_default(srv):
    st, _, h = preflight(srv, "https://any.example", req_headers="content-type, authorization, x-request-id")
    check("cors: default preflight from any origin -> 200, Allow-Origin *",
          st == 200 and h.get("Access-Control-Allow-Origin") == "*", (st, h))
    check("cors: ... allows POST and mirrors the requested headers",
          "POST" in h.get("Access-Control-Allow-Methods", "")
          and h.get("Access-Control-Allow-Headers") == "content-type, authorization, x-request-id", h)
    c = srv.conn()
    kept = []
    for _ in range(2):
        c.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "https://any.example",
                                                               "Access-Control-Request-Method": "POST"})
        r = c.getresponse()
        r.read()
        kept.append((r.status, r.getheader("Connection")))
    c.close()
    check("cors: preflights keep the connection open", kept == [(200, None), (200, None)], kept)
    st, _, h = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 2}, {"Origin": "https://any.example"})
    check("cors: a completion from an origin carries Allow-Origin *", st == 200 and h.get("Access-Control-Allow-Origin") == "*", h)
    c = srv.conn()
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": [1], "max_tokens": 2, "stream": True}),
              headers={"Content-Type": "application/json", "Origin": "https://any.example"})
    r = c.getresponse()
    r.read()
    c.close()
    check("cors: a stream from an origin carries Allow-Origin *", r.status == 200 and r.getheader("Access-Control-Allow-Origin") == "*",
          r.getheaders())
    st, _, h = srv.get("/v1/models")
    check("cors: no Origin, no CORS headers", "Access-Control-Allow-Origin" not in h, h)
    st, _, h = srv.request("OPTIONS", "/v1/completions")
    check("cors: OPTIONS that is not a preflight -> 405", st == 405, st)


def test_cors_flags(binary, model):
    cfg = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"allowed-headers": ["Authorization", "X-Request-Id"]}, cfg)
    cfg.close()
    srv = Server(binary, model, "--api-key", "sk-c", "--allowed-origins", '["https://good.example"]', "--allow-credentials",
                 "--allowed-methods", '["POST", "GET"]', "--config", cfg.name)
    key = {"Authorization": "Bearer sk-c"}
    try:
        st, _, h = preflight(srv, "https://good.example", req_headers="authorization, content-type")
        check("cors: allowed origin's preflight -> 200 without an API key, origin echoed, credentials",
              st == 200 and h.get("Access-Control-Allow-Origin") == "https://good.example"
              and h.get("Access-Control-Allow-Credentials") == "true" and h.get("Vary") == "Origin", (st, h))
        check("cors: ... lists the configured methods and headers (from --config's JSON array)",
              h.get("Access-Control-Allow-Methods") == "POST, GET"
              and "authorization" in h.get("Access-Control-Allow-Headers", "")
              and "x-request-id" in h.get("Access-Control-Allow-Headers", ""), h)
        st, data, h = preflight(srv, "https://evil.example")
        check("cors: another origin's preflight -> 400, no Allow-Origin",
              st == 400 and "Access-Control-Allow-Origin" not in h and b"origin" in data, (st, h, data[:200]))
        st, data, _ = preflight(srv, "https://good.example", method="DELETE")
        check("cors: a method not allowed -> 400", st == 400 and b"method" in data, (st, data[:200]))
        st, data, _ = preflight(srv, "https://good.example", req_headers="x-custom")
        check("cors: a header not allowed -> 400", st == 400 and b"headers" in data, (st, data[:200]))
        st, _, h = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 2}, {**key, "Origin": "https://good.example"})
        check("cors: allowed origin's completion -> origin echoed with credentials",
              st == 200 and h.get("Access-Control-Allow-Origin") == "https://good.example"
              and h.get("Access-Control-Allow-Credentials") == "true", h)
        st, _, h = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 2}, {**key, "Origin": "https://evil.example"})
        check("cors: another origin's completion has no Allow-Origin", st == 200 and "Access-Control-Allow-Origin" not in h, h)
        st, _, h = srv.get("/v1/models", {"Origin": "https://good.example"})
        check("cors: a 401 to an allowed origin still carries Allow-Origin (the page can read it)",
              st == 401 and h.get("Access-Control-Allow-Origin") == "https://good.example", (st, h))
    finally:
        srv.stop()
        os.unlink(cfg.name)
    p = subprocess.run([binary, "serve", "-m", model, "--port", "0", "--allowed-origins", "https://x.example"],
                       capture_output=True, text=True, timeout=20)
    check("cors: --allowed-origins that is not a JSON list -> exit 2 naming the flag",
          p.returncode == 2 and "--allowed-origins" in p.stderr, (p.returncode, p.stderr[-300:]))


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
    tests_main = [("too_large", test_too_large), ("fields", test_fields), ("request_id", test_request_id),
                  ("fingerprint", lambda srv: test_fingerprint(srv, args.bin)), ("cors_default", test_cors_default)]
    tests_own = [("port_in_use", test_port_in_use), ("version_ping", test_version_ping), ("cors_flags", test_cors_flags)]
    srv = None
    try:
        if any(args.k in n for n, _ in tests_main):
            srv = Server(args.bin, model, "--max-request-bytes", str(LIMIT))
            srv.model_id = model
            for name, fn in tests_main:
                if args.k in name:
                    print(f"== {name}")
                    try:
                        fn(srv)
                    except Exception:  # noqa: BLE001
                        check(f"{name}: ran without an exception", False, traceback.format_exc())
            check("server: SIGTERM exits 0", srv.stop() == 0)
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
