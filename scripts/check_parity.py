#!/usr/bin/env python3
"""HF parity of any backend: runs `duoserve generate` on every case of tests/fixtures/hf/*/
expected.json and compares greedy ids and top-5 logprobs with HF transformers' (float32).

    python3 scripts/check_parity.py --bin build/duoserve --device cuda --tol 0.05 [--tp 2]

A greedy id may differ only where HF's own top-2 margin is below --tol (a near-tie that bf16
rounding can flip); logprobs are compared up to the first divergence. --tp N splits each model
over N tensor-parallel ranks (families whose heads N does not divide are skipped). Exit 1 on
failure."""
import argparse
import glob
import json
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/duoserve")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tol", type=float, default=2e-3)
    ap.add_argument("--fixtures", default="tests/fixtures/hf")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks")
    a = ap.parse_args()
    fails = 0
    for d in sorted(glob.glob(os.path.join(a.fixtures, "*"))):
        exp = json.load(open(os.path.join(d, "expected.json")))
        cfg = json.load(open(os.path.join(d, "config.json")))
        if a.tp > 1 and (cfg["num_attention_heads"] % a.tp or cfg["num_key_value_heads"] % a.tp
                         or cfg["intermediate_size"] % a.tp):
            print(f"skip {exp['family']}: --tp {a.tp} does not divide its heads")
            continue
        for c in exp["cases"]:
            n = len(c["greedy_ids"])
            cmd = [a.bin, "generate", "-m", d, "--prompt-ids", ",".join(map(str, c["prompt_ids"])), "-n", str(n),
                   "--ignore-eos", "--top-logprobs", "5", "--json", "--device", a.device, "-tp", str(a.tp)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                print(f"FAIL {exp['family']} prompt {len(c['prompt_ids'])}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
                fails += 1
                continue
            out = json.loads(r.stdout)
            ids, worst, status = out["ids"], 0.0, "ok"
            for i in range(n):
                ours = {t: lp for t, lp in out["top_logprobs"][i]}
                for t, lp in c["top_logprobs"][i]:
                    if t in ours:
                        worst = max(worst, abs(ours[t] - lp))
                if ids[i] != c["greedy_ids"][i]:
                    top = c["top_logprobs"][i]
                    margin = top[0][1] - top[1][1]
                    status = f"diverges at {i} (HF top-2 margin {margin:.4f})"
                    if margin >= a.tol:
                        status = "FAIL " + status
                    break
            bad = worst > a.tol or status.startswith("FAIL")
            fails += bad
            print(f"{'FAIL' if bad else 'ok  '} {exp['family']:8s} prompt {len(c['prompt_ids']):5d}: "
                  f"max |dlogprob| {worst:.2e} (tol {a.tol:g}); ids {status}")
    print(f"parity ({a.device}): {'FAILED' if fails else 'ok'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
