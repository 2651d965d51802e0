#!/usr/bin/env python3
"""End-to-end tests of prefix caching through `duoserve serve` (stories260k, CPU; loopback only).

A chat of three turns (each turn resends the conversation with the server's own answers), and
the same through /v1/completions with token ids, on a server with the cache (the default) and
one started with --no-enable-prefix-caching:
  * the answers (greedy, with logprobs) are the same bits on both servers;
  * usage.prompt_tokens_details.cached_tokens is 0 on the first turn and on the cache-less server,
    and on later turns counts the earlier turn's tokens (its prompt and answer but the last token);
  * /metrics: prefix_cache_queries_total / prefix_cache_hits_total move by the prompt tokens and
    the cached tokens, cache_config_info says enable_prefix_caching True / False;
  * --enable-prefix-caching=false and a bad value (usage error).
Every loop is bounded in count and time. Prints "N passed, M failed"; exits 1 on a failure.

usage: tests/e2e_prefix_cache.py [--bin build/duoserve] [--model ../shared/models/stories260k]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402
from e2e_server import Server, check  # noqa: E402

ROOT = es.ROOT
P = "duoserve:"


def completion(srv, prompt_ids, max_tokens):
    st, data, _ = srv.post("/v1/completions", {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
                                               "logprobs": 3, "ignore_eos": True, "return_tokens_as_token_ids": True})
    assert st == 200, data[:300]
    return json.loads(data)


def answer_ids(resp):
    return [int(t.split(":")[1]) for t in resp["choices"][0]["logprobs"]["tokens"]]


def cached(resp):
    return (resp["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")


def counters(srv):
    m = srv.metrics()
    return m.get(P + "prefix_cache_queries_total", -1), m.get(P + "prefix_cache_hits_total", -1)


def turns(srv):
    """Three completions turns; returns their responses."""
    out, prompt = [], list(range(5, 45))  # 40 tokens
    for t in range(3):
        r = completion(srv, prompt, 10)
        out.append(r)
        prompt = prompt + answer_ids(r) + [50 + t, 51 + t, 52 + t]
    return out


def chat(srv):
    msgs, out = [{"role": "user", "content": "Once upon a time there was a little girl named Lily."}], []
    for t in range(3):
        st, data, _ = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0,
                                                        "logprobs": True, "top_logprobs": 2})
        assert st == 200, data[:300]
        r = json.loads(data)
        out.append(r)
        msgs = msgs + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                       {"role": "user", "content": f"And then what happened, part {t + 2}?"}]
    return out


def test_turns(on, off):
    q0, h0 = counters(on)
    a, b = turns(on), turns(off)
    for t in range(3):
        check(f"completions turn {t + 1}: same ids and logprobs with and without the cache",
              a[t]["choices"][0]["logprobs"] == b[t]["choices"][0]["logprobs"])
        check(f"completions turn {t + 1}: no cached tokens without the cache", cached(b[t]) == 0, b[t]["usage"])
    check("completions turn 1: nothing cached", cached(a[0]) == 0, a[0]["usage"])
    for t in (1, 2):
        prev = a[t - 1]["usage"]
        want = prev["prompt_tokens"] + prev["completion_tokens"] - 1  # the earlier turn's tokens but the last
        check(f"completions turn {t + 1}: cached tokens = the earlier turn's computed tokens",
              cached(a[t]) == want, (cached(a[t]), want))
    q1, h1 = counters(on)
    prompts = sum(r["usage"]["prompt_tokens"] for r in a)
    check("metrics: prefix_cache_queries_total moved by the prompt tokens", q1 - q0 == prompts, (q0, q1, prompts))
    check("metrics: prefix_cache_hits_total moved by the cached tokens", h1 - h0 == sum(cached(r) for r in a),
          (h0, h1))
    qo, ho = counters(off)
    check("metrics without the cache: no queries, no hits", qo == 0 and ho == 0, (qo, ho))
    last = a[2]["usage"]
    blocks = (last["prompt_tokens"] + last["completion_tokens"] - 1) // 16  # the last turn's whole blocks
    bon, boff = on.metrics().get(P + "prefix_cache_blocks", -1), off.metrics().get(P + "prefix_cache_blocks", -1)
    check("metrics: prefix_cache_blocks holds at least the last turn's whole blocks", bon >= blocks > 0, (bon, blocks))
    check("metrics without the cache: prefix_cache_blocks 0", boff == 0, boff)


def test_chat(on, off):
    a, b = chat(on), chat(off)
    for t in range(3):
        check(f"chat turn {t + 1}: same answer and logprobs with and without the cache",
              a[t]["choices"][0]["message"] == b[t]["choices"][0]["message"]
              and a[t]["choices"][0]["logprobs"] == b[t]["choices"][0]["logprobs"])
    check("chat: later turns find the earlier ones in the cache", cached(a[1]) > 0 and cached(a[2]) > cached(a[1]),
          [cached(r) for r in a])


def test_cache_info(on, off):
    for srv, want in ((on, "True"), (off, "False")):
        _, data, _ = srv.get("/metrics")
        line = [x for x in data.decode().splitlines() if x.startswith(P + "cache_config_info{")]
        check(f"cache_config_info: enable_prefix_caching=\"{want}\"",
              line and f'enable_prefix_caching="{want}"' in line[0], line)


def test_flags(binary, model):
    r = subprocess.run([binary, "serve", "-m", model, "--port", "0", "--enable-prefix-caching=maybe"],
                       capture_output=True, timeout=30)
    check("--enable-prefix-caching=maybe: usage error, exit 2", r.returncode == 2 and b"true or false" in r.stderr,
          r.stderr[-300:])
    srv = Server(binary, model, "--enable-prefix-caching=false")
    try:
        a = turns(srv)
        check("--enable-prefix-caching=false: nothing cached", all(cached(r) == 0 for r in a))
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=es.STORIES260K)
    args = ap.parse_args()
    model = os.path.normpath(args.model)
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"  SKIP: {model} not found")
        print("0 passed, 0 failed")
        return 0
    on = off = None
    tmp = tempfile.mkdtemp(prefix="duo-prefix-")
    tmpl = os.path.join(tmp, "chat.jinja")  # stories260k has no chat template of its own
    with open(tmpl, "w") as f:
        f.write("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    try:
        on = Server(args.bin, model, "--block-size", "16", "--chat-template", tmpl)
        off = Server(args.bin, model, "--block-size", "16", "--chat-template", tmpl, "--no-enable-prefix-caching")
        for name, fn in (("turns", test_turns), ("chat", test_chat), ("cache_info", test_cache_info)):
            print(f"== {name}")
            try:
                fn(on, off)
            except Exception:  # noqa: BLE001
                check(f"{name}: ran without an exception", False, traceback.format_exc())
        print("== flags")
        try:
            test_flags(args.bin, model)
        except Exception:  # noqa: BLE001
            check("flags: ran without an exception", False, traceback.format_exc())
        check("server with the cache: SIGTERM exits 0", on.stop() == 0)
        check("server without the cache: SIGTERM exits 0", off.stop() == 0)
    finally:
        for s in (on, off):
            if s:
                s.stop(signal.SIGKILL)
        os.unlink(tmpl)
        os.rmdir(tmp)
    print(f"{len(es.PASS)} passed, {len(es.FAIL)} failed")
    return 1 if es.FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
