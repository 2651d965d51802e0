#!/usr/bin/env python3
"""End-to-end tests of duoserve's HTTP layer over loopback (Python standard library only).

A port held by another duoserve (or any program) is refused with exit 1. Every loop is
bounded in count and time. Prints one closing line "N passed, M failed"; exits 1 if anything failed.

usage: tests/e2e_http.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import time
import traceback

sys.dont_write_bytecode = True  # importing e2e_server must not leave tests/__pycache__ behind
from e2e_server import FAIL, PASS, ROOT, Server, check


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



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260k"))
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    model = os.path.normpath(args.model)
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"  SKIP: {model} not found")
        print("0 passed, 0 failed")
        return 0
    tests_own = [("port_in_use", test_port_in_use)]
    for name, fn in tests_own:
        if args.k in name:
            print(f"== {name}")
            try:
                fn(args.bin, model)
            except Exception:  # noqa: BLE001
                check(f"{name}: ran without an exception", False, traceback.format_exc())
    print(f"{len(PASS)} passed, {len(FAIL)} failed")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
