#!/usr/bin/env python3
"""End-to-end tests of `duoserve tokenize`, `detokenize` and `chat-template` against the shared
fixtures: HF tokenizer vectors and HF apply_chat_template renders. Prints "N passed, M failed"."""
import argparse
import json
import os
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build/duoserve")
args = ap.parse_args()
shared = os.environ.get("DUO_SHARED", "../shared")
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"  FAIL {name} {detail}")


def run(cmd, inp):
    r = subprocess.run([args.bin] + cmd, input=inp.encode(), capture_output=True, timeout=60)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


if not os.path.isdir(os.path.join(shared, "tokenizer-vectors")):
    print(f"SKIP: {shared}/tokenizer-vectors not found (set DUO_SHARED)")
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(0)

# tokenize: every vector input gives HF's ids; detokenize gives the text back
for name, tdir in (("llama3", "llama3"), ("llama2", "llama2"), ("qwen2", "qwen3")):
    inputs = open(os.path.join(shared, "tokenizer-vectors", name + ".inp"), encoding="utf-8").read()
    inputs = inputs.split("\n__ggml_vocab_test__\n")
    outs = open(os.path.join(shared, "tokenizer-vectors", name + ".out")).read().split("\n")
    model = os.path.join(shared, "tokenizers", tdir)
    n_ok = 0
    for i, text in enumerate(inputs[: len(outs)]):
        if i >= len(outs) or (outs[i] == "" and text != ""):
            continue
        rc, out, err = run(["tokenize", "-m", model], text)
        want = outs[i].split()
        ok = rc == 0 and out.split() == want
        check(f"tokenize {name} #{i}", ok, f"got {out.strip()[:80]} want {' '.join(want)[:80]} {err[:100]}")
        if ok and want and name != "llama2":  # byte-level tokenizers round-trip exactly
            rc, back, err = run(["detokenize", "-m", model], out)
            check(f"detokenize {name} #{i}", rc == 0 and back == text, f"{back[:60]!r} != {text[:60]!r}")
        n_ok += ok
    print(f"  tokenize {name}: {n_ok} inputs match HF")

# chat-template: every render equals HF's text
renders = json.load(open(os.path.join(shared, "chat-templates", "expected_renders.json")))
for tname, cases in renders.items():
    model = os.path.join(shared, "tokenizers", tname)
    n_ok = 0
    for cname, case in cases.items():
        req = json.dumps({"messages": case["messages"], "add_generation_prompt": case["add_generation_prompt"]})
        rc, out, err = run(["chat-template", "-m", model], req)
        ok = rc == 0 and out == case["text"]
        check(f"chat-template {tname} {cname}", ok, f"rc={rc} {err[:200]}")
        n_ok += ok
    print(f"  chat-template {tname}: {n_ok}/{len(cases)} renders equal HF's")

# a template that raises: exit 2, the exception's text on stderr (llama2 requires alternating roles)
rc, out, err = run(["chat-template", "-m", os.path.join(shared, "tokenizers", "llama2")],
                   json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}))
check("chat-template raise_exception exits 2 with its message", rc == 2 and "alternate" in err, f"rc={rc} {err}")
# no template: a clear error
rc, out, err = run(["chat-template", "-m", os.path.join(shared, "tokenizers", "mistral-v0.1")],
                   json.dumps({"messages": [{"role": "user", "content": "a"}]}))
check("chat-template without a template exits 2", rc == 2 and "no chat template" in err, f"rc={rc} {err}")
# usage errors
rc, _, _ = run(["tokenize"], "x")
check("tokenize without -m exits 2", rc == 2)

print(f"e2e_text_cli: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
