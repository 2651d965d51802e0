#!/usr/bin/env python3
"""End-to-end tests of the text duoserve returns: only the generated tokens' text (never the
prompt's, also when the prompt ends in byte-fallback tokens, as CJK does on Llama-2-style
vocabularies and every prompt does on the demo model), through `generate`, /v1/completions
(streamed or not) and chat; logprobs tokens as they appear in the text (leading spaces kept,
partial characters as "bytes:\\xNN") with text_offset the character offset of each; streams that
deliver each character as soon as it is whole.

The expected text of a completion is computed apart from the server: the CLI's `detokenize` of
prompt + generated ids, less that of the prompt. Loops are bounded in count and time. Prints
"N passed, M failed"; exits 1 if anything failed.

usage: tests/e2e_text_output.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e2e_server import FAIL, PASS, Server, check, STORIES260K, stream  # noqa: E402

CJK_PROMPT = "Lily saw a 日本"  # 日本 is six <0xNN> tokens in stories260k's vocabulary


def cli(binary, args, inp=None, env=None):
    r = subprocess.run([binary, *args], input=inp.encode() if inp is not None else None, capture_output=True,
                       timeout=60, env={**os.environ, **(env or {})})
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def completion_of(binary, model, prompt_ids, ids):
    """decode(prompt + ids) less decode(prompt): the text the ids add after the prompt."""
    _, pre, _ = cli(binary, ["detokenize", "-m", model], " ".join(map(str, prompt_ids)))
    _, full, _ = cli(binary, ["detokenize", "-m", model], " ".join(map(str, prompt_ids + ids)))
    return full[len(pre):] if full.startswith(pre) else None


def stream_texts(events, chat=False):
    out = []
    for e in events:
        for c in e.get("choices", []):
            t = c.get("delta", {}).get("content") if chat else c.get("text")
            if t:
                out.append(t)
    return out


def lp_consistent(text, lp):
    """Each whole token sits in the text at its text_offset; offsets never go back."""
    toks, offs = lp["tokens"], lp["text_offset"]
    bad = [(i, t, o) for i, (t, o) in enumerate(zip(toks, offs))
           if not t.startswith("bytes:") and text[o:o + len(t)] != t]
    ordered = all(a <= b for a, b in zip(offs, offs[1:])) and all(0 <= o <= len(text) for o in offs)
    return not bad and ordered, bad[:5]


# ---- stories260k: a Llama-2-style vocabulary with byte fallback ----

def test_cjk_prompt(binary, model, srv):
    rc, out, err = cli(binary, ["generate", "-m", model, "--prompt", CJK_PROMPT, "-n", "10", "--temperature", "0",
                                "--device", "cpu", "--json"])
    j = json.loads(out) if rc == 0 else {}
    check("generate: the prompt ends in byte tokens", rc == 0 and all(3 <= i < 259 for i in j["prompt_ids"][-6:]),
          (rc, err[-300:], j.get("prompt_ids")))
    if rc != 0:
        return
    want = completion_of(binary, model, j["prompt_ids"], j["ids"])
    check("generate: the prompt's text is a prefix of the decoded whole", want is not None)
    check("generate --json: text is the generated ids' text only", j["text"] == want and "日本" not in j["text"],
          (j["text"], want))
    rc, out, _ = cli(binary, ["generate", "-m", model, "--prompt", CJK_PROMPT, "-n", "10", "--temperature", "0",
                              "--device", "cpu"])
    check("generate: prints the generated text only", rc == 0 and out == want + "\n", (out, want))

    body = {"prompt": CJK_PROMPT, "max_tokens": 10, "temperature": 0}
    st, data, _ = srv.post("/v1/completions", body)
    text = json.loads(data)["choices"][0]["text"] if st == 200 else None
    check("completions: text is the generated text only", text == want, (st, text, want))
    st, events, done, _ = stream(srv, {**body, "stream": True})
    check("completions stream: text is the generated text only", st == 200 and done
          and "".join(stream_texts(events)) == want, stream_texts(events))
    chat = {"_path": "/v1/chat/completions", "messages": [{"role": "user", "content": CJK_PROMPT}], "max_tokens": 10,
            "temperature": 0}
    st, data, _ = srv.post(chat.pop("_path"), chat)
    content = json.loads(data)["choices"][0]["message"]["content"] if st == 200 else None
    check("chat: content is the generated text only", content == want, (st, data[:300], want))
    st, events, done, _ = stream(srv, {**chat, "_path": "/v1/chat/completions", "stream": True})
    check("chat stream: content is the generated text only", st == 200 and done
          and "".join(stream_texts(events, chat=True)) == want, stream_texts(events, chat=True))


def test_byte_tokens_stream(binary, model, srv):
    # every step forced to <0x0A>: each newline is a whole character, so each goes out at once
    body = {"prompt": "Lily", "max_tokens": 6, "temperature": 0, "logit_bias": {"13": 100}, "stream": True}
    st, events, done, _ = stream(srv, body)
    texts = stream_texts(events)
    check("stream: byte tokens that are whole characters come one event each", st == 200 and done
          and texts == ["\n"] * 6, texts)


def test_logprobs(binary, model, srv):
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "logprobs": 1}
    st, data, _ = srv.post("/v1/completions", body)
    c = json.loads(data)["choices"][0] if st == 200 else {}
    lp = c.get("logprobs") or {"tokens": [], "text_offset": []}
    toks, offs = lp["tokens"], lp["text_offset"]
    check("logprobs: tokens join to the text", st == 200 and len(toks) == 24 and "".join(toks) == c["text"],
          (toks[:6], c.get("text", "")[:40]))
    check("logprobs: tokens keep their leading space", sum(t.startswith(" ") for t in toks) >= 5, toks[:8])
    check("logprobs: text_offset is each token's character offset",
          offs == [len("".join(toks[:i])) for i in range(len(toks))], offs[:8])
    top = lp.get("top_logprobs") or [{}]
    check("logprobs: top_logprobs keys are tokens as in the text", all(toks[i] in top[i] for i in range(len(toks))),
          top[:2])
    # a BOS-only prompt: the first token begins the text, without its space there and here
    st, data, _ = srv.post("/v1/completions", {**body, "prompt": [1], "max_tokens": 8})
    c = json.loads(data)["choices"][0] if st == 200 else {}
    toks = (c.get("logprobs") or {}).get("tokens", [])
    check("logprobs after a BOS-only prompt: tokens join to the text", st == 200 and toks
          and "".join(toks) == c["text"] and not toks[0].startswith(" "), (toks[:3], c.get("text")))
    # a stop string holds back text that may start it (" Lily" of "Lily X"): the next token's
    # offset still counts from its own start, streamed or not
    sbody = {**body, "prompt": [1], "max_tokens": 30, "stop": ["Lily X"]}
    st, data, _ = srv.post("/v1/completions", sbody)
    c = json.loads(data)["choices"][0] if st == 200 else {}
    lp = c.get("logprobs") or {"tokens": [], "text_offset": []}
    ok, bad = lp_consistent(c.get("text", ""), lp)
    check("logprobs with a held-back stop prefix: offsets right", st == 200 and "Lily." in c["text"] and ok, bad)
    st, events, done, _ = stream(srv, {**sbody, "stream": True})
    s_toks = [t for e in events for ch in e.get("choices", []) if ch.get("logprobs") for t in ch["logprobs"]["tokens"]]
    s_offs = [o for e in events for ch in e.get("choices", []) if ch.get("logprobs") for o in ch["logprobs"]["text_offset"]]
    check("logprobs streamed: the same tokens and offsets", st == 200 and s_toks == lp["tokens"]
          and s_offs == lp["text_offset"], (s_offs[:12], lp["text_offset"][:12]))
    # chat: each token's text with its leading space; bytes its UTF-8
    st, data, _ = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Once upon a time"}],
                                                    "max_tokens": 12, "temperature": 0, "logprobs": True})
    ch = json.loads(data)["choices"][0] if st == 200 else {}
    content = (ch.get("logprobs") or {}).get("content") or []
    check("chat logprobs: tokens join to the content", st == 200 and content
          and "".join(e["token"] for e in content) == ch["message"]["content"]
          and all(bytes(e["bytes"]) == e["token"].encode() for e in content), content[:3])


# ---- the demo model: a byte-level vocabulary (every token is one byte) ----

def test_demo(binary, demo_dir, srv):
    # README's chat example
    st, data, _ = srv.post("/v1/chat/completions", {"model": "duoserve-demo", "messages": [{"role": "user", "content": "Hi"}],
                                                    "max_tokens": 8})
    content = json.loads(data)["choices"][0]["message"]["content"] if st == 200 else ""
    check("demo chat: content holds no part of the template", st == 200 and "<|" not in content
          and len(content) <= 8, content)
    body = {"prompt": "hi", "max_tokens": 64, "seed": 5, "logprobs": 1, "ignore_eos": True}
    st, data, _ = srv.post("/v1/completions", body)
    c = json.loads(data)["choices"][0] if st == 200 else {}
    lp = c.get("logprobs") or {"tokens": [], "text_offset": []}
    ok, bad = lp_consistent(c.get("text", ""), lp)
    partial = [t for t in lp["tokens"] if t.startswith("bytes:\\x")]
    check("demo logprobs: tokens sit at their text_offset", st == 200 and ok and len(lp["tokens"]) == 64, bad)
    check("demo logprobs: partial characters are bytes:\\xNN tokens",
          partial and all(len(t) == 10 for t in partial), lp["tokens"][:10])
    check("demo logprobs: text_offset moves on", lp["text_offset"][-1] >= len(c.get("text", "")) - 1 > 10,
          lp["text_offset"][-8:])
    st, events, done, _ = stream(srv, {**body, "stream": True})
    s_offs = [o for e in events for ch in e.get("choices", []) if ch.get("logprobs") for o in ch["logprobs"]["text_offset"]]
    check("demo logprobs streamed: same text and offsets", st == 200 and "".join(stream_texts(events)) == c.get("text")
          and s_offs == lp["text_offset"], s_offs[:10])


def test_demo_stream_is_incremental(binary, demo_dir, srv):
    n = 1000
    conn = srv.conn(120)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": n, "stream": True,
                                                              "ignore_eos": True, "seed": 1}),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    t0, first, last, n_text, text = time.time(), None, None, 0, ""
    for _ in range(10 * n):
        line = r.readline()
        if not line or line.strip() == b"data: [DONE]":
            break
        if line.startswith(b"data: "):
            ch = json.loads(line[6:])["choices"][0]
            if ch.get("text"):
                n_text += 1
                text += ch["text"]
                first = first if first is not None else time.time() - t0
            if ch.get("finish_reason"):
                last = time.time() - t0
    conn.close()
    check("demo stream: many events with text (one per character)", n_text >= n // 4, n_text)
    check("demo stream: the first text comes well before the finish",
          first is not None and last is not None and first < 0.5 * last, (first, last))
    st, data, _ = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": n, "ignore_eos": True, "seed": 1})
    check("demo stream: the same text as not streamed", st == 200 and json.loads(data)["choices"][0]["text"] == text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "build", "duoserve"))
    ap.add_argument("--model", default=STORIES260K)
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    binary, model = os.path.abspath(args.bin), os.path.normpath(args.model)
    tmp = tempfile.mkdtemp(prefix="duo-text-")
    try:
        if os.path.exists(os.path.join(model, "config.json")):
            tmpl = os.path.join(tmp, "tmpl.jinja")
            with open(tmpl, "w") as f:  # the user's content is the whole prompt, after BOS
                f.write("<s>{% for m in messages %}{{ m['content'] }}{% endfor %}")
            srv = Server(binary, model, "--chat-template", tmpl)
            try:
                for name, fn in (("cjk_prompt", test_cjk_prompt), ("byte_tokens_stream", test_byte_tokens_stream),
                                 ("logprobs", test_logprobs)):
                    if args.k in name:
                        print(f"== {name}")
                        try:
                            fn(binary, model, srv)
                        except Exception:  # noqa: BLE001
                            check(f"{name}: ran without an exception", False, traceback.format_exc())
            finally:
                srv.stop()
        else:
            print(f"  SKIP: {model} not found (the stories260k tests)")
        tests = [("demo", test_demo), ("demo_stream", test_demo_stream_is_incremental)]
        if any(args.k in name for name, _ in tests):
            env = {"DUOSERVE_CACHE": os.path.join(tmp, "cache")}
            rc, _, err = cli(binary, ["generate", "--prompt-ids", "1", "-n", "1"], env=env)
            demo_dir = os.path.join(tmp, "cache", "demo-llama-v1")
            check("demo model written", rc == 0 and os.path.isdir(demo_dir), err[-300:])
            srv = Server(binary, demo_dir, "--served-model-name", "duoserve-demo")
            try:
                for name, fn in tests:
                    if args.k in name:
                        print(f"== {name}")
                        try:
                            fn(binary, demo_dir, srv)
                        except Exception:  # noqa: BLE001
                            check(f"{name}: ran without an exception", False, traceback.format_exc())
            finally:
                srv.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(PASS)} passed, {len(FAIL)} failed")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
