#!/usr/bin/env python3
"""End-to-end tests of `duoserve serve` starting and stopping (Python standard library only).

What a newcomer meets first: a model directory that is not there (or not a model) is refused
before anything listens; so are missing --duo-pattern / --chat-template files and --device cuda
without a usable GPU; with --log-format json every line on stderr is a JSON object, the
loader's, the warm-up's, the HTTP transport's refusals, errors and shutdown included (stories260k and the
built-in demo model); the warm-up runs before the server says ready and leaves no trace in /metrics, and the
first request gets the golden output. Every loop is bounded in count and time.
Prints one closing line "N passed, M failed"; exits 1 if anything failed.

usage: tests/e2e_startup.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server  # noqa: E402
from e2e_server import Server, check  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_serve(binary, *args, env=None, timeout=20):
    """Runs `serve` expecting it to refuse to start; returns (exit status, stderr lines)."""
    try:
        r = subprocess.run([binary, "serve", "--host", "127.0.0.1", "--port", "0", *args], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=timeout, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stderr or b"").decode("utf-8", "replace").splitlines()
    return r.returncode, r.stderr.decode("utf-8", "replace").splitlines()


def json_lines(lines):
    """The lines that are not one JSON object with ts, level and msg."""
    bad = []
    for line in lines:
        try:
            o = json.loads(line)
            ok = isinstance(o, dict) and all(isinstance(o.get(k), str) for k in ("ts", "level", "msg"))
        except ValueError:
            ok = False
        if not ok:
            bad.append(line)
    return bad


class DemoServer(Server):
    """Server with no -m: the built-in demo model (written into $DUOSERVE_CACHE)."""

    def __init__(self, binary, *extra, env=None):  # pylint: disable=super-init-not-called
        self.args = [binary, "serve", "--host", "127.0.0.1", "--port", "0", *extra]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env={**os.environ, **(env or {})})
        self.lines, self.port = [], None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.time() + 30
        while time.time() < deadline and self.proc.poll() is None:
            try:
                if self.port and self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("demo server did not become healthy: " + "".join(self.lines)[-2000:])


# ---- tests ----

def test_bad_inputs(binary, model):
    with tempfile.TemporaryDirectory() as tmp:
        missing = os.path.join(tmp, "no-such-model")
        rc, lines = run_serve(binary, "-m", missing)
        log = "\n".join(lines)
        check("-m missing dir: exit 1", rc == 1, (rc, log))
        check("-m missing dir: says 'model directory not found' and names it",
              f"model directory not found: {missing}" in log, log)
        check("-m missing dir: nothing listened", "listening" not in log, log)
        check("-m missing dir: one line", len(lines) == 1, lines)

        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        rc, lines = run_serve(binary, "-m", empty)
        log = "\n".join(lines)
        check("-m dir without config.json: exit 1, before listening", rc == 1 and "listening" not in log, (rc, log))
        check("-m dir without config.json: names config.json, says it is not a model directory",
              f"{empty}/config.json not found" in log and "not a Hugging Face model directory" in log, log)

        afile = os.path.join(tmp, "model.safetensors")
        open(afile, "wb").close()
        rc, lines = run_serve(binary, "-m", afile)
        log = "\n".join(lines)
        check("-m a file: exit 1, 'is not a directory', before listening",
              rc == 1 and "is not a directory" in log and "listening" not in log, (rc, log))

        for flag in ("--duo-pattern", "--chat-template"):
            path = os.path.join(tmp, "missing.file")
            rc, lines = run_serve(binary, "-m", model, flag, path)
            log = "\n".join(lines)
            check(f"{flag} missing file: exit 1 naming it, before listening",
                  rc == 1 and f"{flag} {path}: No such file or directory" in log and "listening" not in log, (rc, log))

        bad = os.path.join(tmp, "bad.jinja")  # the server loads the template once the engine is up
        with open(bad, "w") as f:
            f.write("{% if %}")
        rc, lines = run_serve(binary, "-m", model, "--chat-template", bad)
        log = "\n".join(lines)
        check("--chat-template that does not parse: exit 1 with the template's error, never ready",
              rc == 1 and f"chat template {bad}: line 1" in log and "ready in" not in log, (rc, log))

        # the same refusals as JSON lines
        rc, lines = run_serve(binary, "-m", missing, "--log-format", "json")
        check("-m missing dir, --log-format json: every line JSON", rc == 1 and lines and not json_lines(lines),
              (rc, lines))
        rc, lines = run_serve(binary, "--log-format", "json", "--max-model-len", "abc")
        check("usage error, --log-format json: exit 2, a JSON error line with the integer range",
              rc == 2 and lines and not json_lines(lines) and "[1, 16777216]" in lines[0], (rc, lines))


def test_device_cuda(binary, model):
    version = subprocess.run([binary, "--version"], capture_output=True, timeout=10).stdout.decode()
    rc, lines = run_serve(binary, "-m", model, "--device", "cuda", timeout=20)
    log = "\n".join(lines)
    if "CUDA: no" in version:
        check("--device cuda, CPU-only build: exit 1 before listening, says the build has no CUDA",
              rc == 1 and "listening" not in log and "built without CUDA" in log, (rc, log))
    elif rc == "timeout":
        print("  info --device cuda: a usable GPU is here (it served; the refusal is not testable)")
    else:
        check("--device cuda, no usable GPU: exit 1 before listening with a clear reason",
              rc == 1 and "listening" not in log and "insufficient" not in log
              and re.search(r"no NVIDIA GPU|NVIDIA driver|compute capability", log), (rc, log))


def run_json_server(srv, name):
    """A completion, a client error, SIGTERM; then every stderr line must be JSON."""
    try:
        st, data, _ = srv.post("/v1/completions", {"prompt": [1, 5], "max_tokens": 3})
        check(f"json logs {name}: completion 200", st == 200, (st, data))
        st, _, _ = srv.post("/v1/completions", {"prompt": [1], "max_tokens": -1})
        check(f"json logs {name}: bad request 400", st == 400, st)
        # requests the HTTP transport refuses before any route sees them: logged as request lines too
        for what, payload, want in (("bad header line", b"GET /health HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n", 400),
                                    ("header too big", b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n", 431)):
            try:
                st = e2e_server.parse_raw(e2e_server.raw_request(srv.port, payload))[0]
            except OSError as e:  # a reset before the answer was read
                st = repr(e)
            check(f"json logs {name}: {what} -> {want}", st == want, st)
        rc = srv.stop()
        check(f"json logs {name}: SIGTERM exits 0", rc == 0, rc)
    finally:
        srv.stop(signal.SIGKILL)
    msgs = [json.loads(line).get("msg", "") for line in srv.lines if not json_lines([line])]
    bad = json_lines(srv.lines)
    check(f"json logs {name}: every stderr line is a JSON object", not bad and len(srv.lines) >= 6,
          bad[:5] or srv.lines)
    for want in ("listening on", "loaded ", "KV cache:", "warm-up:", "ready in", "request",
                 ": draining", "stopped"):
        check(f"json logs {name}: has '{want}'", any(want in m for m in msgs), msgs)
    return msgs


def test_json_logs(binary, model):
    run_json_server(Server(binary, model, "--log-format", "json"), "stories260k")
    with tempfile.TemporaryDirectory() as cache:
        msgs = run_json_server(DemoServer(binary, "--log-format", "json", env={"DUOSERVE_CACHE": cache}), "demo")
        check("json logs demo: says it is the demo model", any("built-in demo model" in m for m in msgs), msgs)
    # a model that fails to load after listening: the error is JSON too
    with tempfile.TemporaryDirectory() as tmp:
        fx = os.path.join(ROOT, "tests", "fixtures", "hf", "llama2")
        with open(os.path.join(fx, "config.json"), "rb") as f, open(os.path.join(tmp, "config.json"), "wb") as g:
            g.write(f.read())
        with open(os.path.join(fx, "model.safetensors"), "rb") as f, open(os.path.join(tmp, "model.safetensors"), "wb") as g:
            g.write(f.read(1000))
        rc, lines = run_serve(binary, "-m", tmp, "--log-format", "json")
        check("json logs: a truncated checkpoint fails with exit 1, every line JSON",
              rc == 1 and not json_lines(lines) and any("corrupt or truncated" in line for line in lines), (rc, lines))


def test_warmup(binary, model):
    exp_ids = json.load(open(os.path.join(model, "expected_greedy_ids.json")))["greedy_ids"][:40]
    srv = Server(binary, model)
    try:
        log = "".join(srv.lines)
        warm = log.find("warm-up: 1 forward pass in")
        check("warm-up: logged before ready", 0 <= warm < log.find("ready in"), log[-1500:])
        m = srv.metrics()
        zero = ["duoserve:prompt_tokens_total", "duoserve:generation_tokens_total", "duoserve:num_preemptions_total",
                "duoserve:num_requests_running", "duoserve:num_requests_waiting",
                'duoserve:kv_cache_usage_perc{pool="full"}', 'duoserve:kv_cache_usage_perc{pool="streaming"}']
        zero += [f'duoserve:request_success_total{{finished_reason="{r}"}}' for r in ("stop", "length", "abort")]
        check("warm-up: /metrics after start shows no requests, tokens or KV in use",
              all(m.get(k) == 0 for k in zero), {k: m.get(k) for k in zero})
        body = {"prompt": [1], "max_tokens": len(exp_ids), "temperature": 0, "ignore_eos": True, "logprobs": 0,
                "return_tokens_as_token_ids": True}
        st, data, _ = srv.post("/v1/completions", body)
        lp = json.loads(data)["choices"][0]["logprobs"] if st == 200 else None
        ids = [int(t.split(":")[1]) for t in lp["tokens"]] if lp else None
        check("warm-up: the first request's ids equal the golden ids", ids == exp_ids, (st, (ids or [])[:10]))
        # the engine publishes its counters at the end of a step, which may come after the
        # response's last byte: wait (bounded) for the finish to be counted
        deadline = time.time() + 5
        m = srv.metrics()
        while m.get('duoserve:request_success_total{finished_reason="length"}') != 1 and time.time() < deadline:
            time.sleep(0.05)
            m = srv.metrics()
        check("warm-up: /metrics counts only that request",
              m.get("duoserve:prompt_tokens_total") == 1 and m.get("duoserve:generation_tokens_total") == len(exp_ids)
              and m.get('duoserve:request_success_total{finished_reason="length"}') == 1,
              {k: m.get(k) for k in zero})
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=e2e_server.STORIES260K)
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    model = os.path.normpath(args.model)
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"  SKIP: {model} not found")
        print("0 passed, 0 failed")
        return 0
    for name, fn in (("bad_inputs", test_bad_inputs), ("device_cuda", test_device_cuda),
                     ("json_logs", test_json_logs), ("warmup", test_warmup)):
        if args.k in name:
            print(f"== {name}")
            try:
                fn(args.bin, model)
            except Exception:  # noqa: BLE001
                check(f"{name}: ran without an exception", False, traceback.format_exc())
    print(f"{len(e2e_server.PASS)} passed, {len(e2e_server.FAIL)} failed")
    return 1 if e2e_server.FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
