#!/usr/bin/env python3
"""End-to-end tests of tensor parallelism and dummy weights through the CLI and the daemon, on
the CPU backend (ranks as threads). Python standard library only; every wait is bounded.

- generate -tp 2 / --tensor-parallel-size 4: stories260k's greedy ids and top logprobs equal one
  rank's (logprobs within 2e-5 * max(1, |logprob|): the f32 rounding of the all-reduce sums);
- flag errors exit 2; a rank count that does not divide the model's heads exits 1 naming them,
  for serve before anything listens;
- --load-format dummy: a directory with config.json alone generates, the same ids every run and
  over 2 ranks; without the flag the missing checkpoint is an error;
- serve -tp 2: the golden completion; a rank failing mid-request (fault injection): the request
  gets a 500, /health is not 200 any more and the server exits 1 by itself (no hang).
Prints one closing line "N passed, M failed"; exits 1 if anything failed.

usage: tests/e2e_tp.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server  # noqa: E402
from e2e_server import Server, check  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 2e-5


def generate(binary, *args, env=None, timeout=60):
    r = subprocess.run([binary, "generate", *args], capture_output=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    out = json.loads(r.stdout) if r.returncode == 0 and "--json" in args else None
    return r.returncode, out, r.stderr.decode("utf-8", "replace")


def worst_logprob_diff(a, b):
    return max((abs(x[1] - y[1]) / max(1.0, abs(y[1])) for pa, pb in zip(a, b) for x, y in zip(pa, pb)), default=0.0)


def test_generate(binary, model):
    args = ["-m", model, "--prompt-ids", "1", "-n", "60", "--ignore-eos", "--top-logprobs", "5", "--json"]
    rc, one, err = generate(binary, *args)
    check("generate, one rank: exit 0", rc == 0, err)
    exp = json.load(open(os.path.join(model, "expected_greedy_ids.json")))["greedy_ids"][:60]
    for flag, n in (("-tp", "2"), ("--tensor-parallel-size", "4")):
        rc, out, err = generate(binary, *args, flag, n)
        check(f"generate {flag} {n}: exit 0", rc == 0, err)
        if out is None or one is None:
            continue
        check(f"generate {flag} {n}: the golden ids", out["ids"] == exp == one["ids"], out["ids"][:10])
        w = worst_logprob_diff(out["top_logprobs"], one["top_logprobs"])
        check(f"generate {flag} {n}: top logprobs within {TOL} of one rank's ({w:.1e})", w <= TOL,
              (out["top_logprobs"][:2], one["top_logprobs"][:2]))
        check(f"generate {flag} {n}: the log says the model is split", f"tensor parallel over {n}" in err, err)


def test_errors(binary, model):
    for bad in ("0", "65", "two"):
        rc, _, err = generate(binary, "-m", model, "--prompt-ids", "1", "--tensor-parallel-size", bad)
        check(f"--tensor-parallel-size {bad}: usage error, exit 2", rc == 2 and "[1, 64]" in err, (rc, err))
    rc, _, err = generate(binary, "-m", model, "--prompt-ids", "1", "--load-format", "pt")
    check("--load-format pt: usage error, exit 2", rc == 2 and "auto, safetensors or dummy" in err, (rc, err))
    rc, _, err = generate(binary, "-m", model, "--prompt-ids", "1", "-tp", "3")
    check("generate -tp 3 (8 heads): exit 1, one line naming the heads",
          rc == 1 and len(err.strip().splitlines()) == 1 and "num_attention_heads (8)" in err, (rc, err))
    r = subprocess.run([binary, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-tp", "8"],
                       capture_output=True, timeout=20)
    log = r.stderr.decode("utf-8", "replace")
    check("serve -tp 8 (4 KV heads): exit 1 before listening, naming them",
          r.returncode == 1 and "listening" not in log and "num_key_value_heads (4)" in log, (r.returncode, log))


def test_dummy(binary, model):
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(model, "config.json"), tmp)
        args = ["-m", tmp, "--prompt-ids", "1,5,9", "-n", "24", "--ignore-eos", "--top-logprobs", "3", "--json"]
        rc, _, err = generate(binary, *args)
        check("config.json alone, no --load-format: exit 1 naming model.safetensors",
              rc == 1 and "model.safetensors" in err, (rc, err))
        outs = []
        for extra in ([], [], ["-tp", "2"]):
            rc, out, err = generate(binary, *args, "--load-format", "dummy", *extra)
            check(f"--load-format dummy {' '.join(extra)}: exit 0, says dummy weights",
                  rc == 0 and "dummy weights" in err, (rc, err))
            outs.append(out)
        if all(outs):
            check("--load-format dummy: 24 ids, the same on every run", len(outs[0]["ids"]) == 24
                  and outs[0] == outs[1], (outs[0]["ids"], outs[1]["ids"]))
            check("--load-format dummy -tp 2: the same ids", outs[2]["ids"] == outs[0]["ids"],
                  (outs[2]["ids"], outs[0]["ids"]))
            check("--load-format dummy: logprobs spread (not uniform noise)",
                  outs[0]["top_logprobs"][0][0][1] > -5.0, outs[0]["top_logprobs"][0])


def test_serve(binary, model):
    exp = json.load(open(os.path.join(model, "expected_greedy_ids.json")))["greedy_ids"][:30]
    body = {"prompt": [1], "max_tokens": len(exp), "temperature": 0, "ignore_eos": True, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    srv = Server(binary, model, "-tp", "2")
    try:
        st, data, _ = srv.post("/v1/completions", body)
        lp = json.loads(data)["choices"][0]["logprobs"] if st == 200 else None
        ids = [int(t.split(":")[1]) for t in lp["tokens"]] if lp else None
        check("serve -tp 2: the golden ids", ids == exp, (st, data[:300]))
        check("serve -tp 2: the log says the model is split", any("tensor parallel over 2" in x for x in srv.lines),
              srv.lines[-5:])
        rc = srv.stop()
        check("serve -tp 2: SIGTERM exits 0", rc == 0, rc)
    finally:
        srv.stop()


def test_rank_failure(binary, model):
    # step 1 is the warm-up; the request's prefill is step 2, its first decode step 3 fails
    srv = Server(binary, model, "-tp", "2", env={"DUOSERVE_TP_FAULT_STEP": "3"})
    try:
        st, data, _ = srv.post("/v1/completions", {"prompt": [1], "max_tokens": 8, "ignore_eos": True}, timeout=30)
        check("a rank fails mid-request: the request gets a 500 naming the backend",
              st == 500 and b"backend failed" in data, (st, data[:300]))
        # the server notices within its 200 ms tick: /health turns 503 (or the port closes)
        seen, deadline = [], time.time() + 20
        while time.time() < deadline and srv.proc.poll() is None and (not seen or seen[-1] == 200):
            try:
                seen.append(srv.get("/health")[0])
            except OSError:
                seen.append("closed")
            time.sleep(0.02)
        check("a rank fails: /health stops answering 200", seen and seen[-1] in (503, "closed")
              or srv.proc.poll() is not None, seen[-5:])
        rc = None
        while time.time() < deadline and (rc := srv.proc.poll()) is None:
            time.sleep(0.05)
        check("a rank fails: the server exits 1 by itself", rc == 1, (rc, srv.lines[-5:]))
        check("a rank fails: the log says the engine failed", any("engine failed" in x for x in srv.lines),
              srv.lines[-8:])
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=e2e_server.STORIES260K)
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    model = os.path.normpath(args.model)
    if not os.path.exists(os.path.join(model, "expected_greedy_ids.json")):
        print(f"  SKIP: {model} not found")
        print("0 passed, 0 failed")
        return 0
    for name, fn in (("generate", test_generate), ("errors", test_errors), ("dummy", test_dummy),
                     ("serve", test_serve), ("rank_failure", test_rank_failure)):
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
