#!/usr/bin/env python3
"""End-to-end tests of structured output and tool calls (Python standard library only).

Three daemons on 127.0.0.1 (--port 0): the built-in demo model (random weights, byte-level
vocabulary; its own chat template, which says nothing of tools: calls as a JSON array), the demo
model with Qwen3's chat template from ../shared (calls in <tool_call> tags), and stories260k
(SentencePiece vocabulary) with a small template that names "ipython" (Llama 3.1's JSON calls).
Checks:
  * 200 requests with random schemas (objects, arrays, enums, anyOf, $defs/$ref, bounded
    numbers and strings), over both endpoints, n = 1 and 2, streamed and not, greedy and sampled:
    every output ends by itself (finish_reason "stop") and parses and validates (a small
    validator below, with exact decimal bounds);
  * response_format json_object, guided_json, structured_outputs; text stays unconstrained;
  * bad schemas are 400s naming the field and what is unsupported, and the server stays up;
  * tool_choice required and named are enforced in each syntax (one call when parallel calls are
    off, calls of the named function, arguments that validate against the tool's parameters),
    content null and finish_reason "tool_calls"; streamed tool-call deltas reassemble into the
    non-streamed result; auto answers in text or calls;
  * the chat template gets the tools, and earlier calls' arguments as objects;
  * unconstrained requests give the same text alongside constrained ones.
Every loop is bounded in count and time. Prints "N passed, M failed"; exits 1 on a failure.

usage: tests/e2e_structured.py [--bin build/duoserve] [--model ../shared/models/stories260k] [-k NAME]
"""
import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import traceback
from decimal import Decimal

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_server import FAIL, PASS, ROOT, SHARED, Server, check, error_shape_ok, stream  # noqa: E402



# ---- a JSON Schema validator for the subset (standard semantics), decimals exact ----

def resolve(root, ref):
    cur = root
    for seg in ref[1:].split("/")[1:]:
        seg = seg.replace("~1", "/").replace("~0", "~")
        cur = cur[int(seg)] if isinstance(cur, list) else cur[seg]
    return cur


def is_num(v):
    return isinstance(v, (int, Decimal)) and not isinstance(v, bool)


def same(a, b):
    """JSON equality: numbers by decimal value, booleans apart from numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float, Decimal)) and isinstance(b, (int, float, Decimal)):
        return Decimal(str(a)) == Decimal(str(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def has_type(v, t):
    return {"null": v is None, "boolean": isinstance(v, bool), "object": isinstance(v, dict),
            "array": isinstance(v, list), "string": isinstance(v, str), "number": is_num(v),
            "integer": is_num(v) and Decimal(v) == Decimal(v).to_integral_value()}[t]


def valid(s, v, root):
    if s is True or s == {}:
        return True
    if s is False:
        return False
    if "$ref" in s:
        return valid(resolve(root, s["$ref"]), v, root)
    if "allOf" in s and not all(valid(a, v, root) for a in s["allOf"]):
        return False
    if "anyOf" in s and not any(valid(a, v, root) for a in s["anyOf"]):
        return False
    if "enum" in s and not any(same(v, e) for e in s["enum"]):
        return False
    if "const" in s and not same(v, s["const"]):
        return False
    t = s.get("type")
    if t is not None and not any(has_type(v, x) for x in (t if isinstance(t, list) else [t])):
        return False
    if isinstance(v, dict):
        props, ap = s.get("properties", {}), s.get("additionalProperties", True)
        if any(r not in v for r in s.get("required", [])):
            return False
        for k, x in v.items():
            if k in props:
                if not valid(props[k], x, root):
                    return False
            elif ap is False or (isinstance(ap, dict) and not valid(ap, x, root)):
                return False
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", 1 << 30):
            return False
        if "items" in s and not all(valid(s["items"], x, root) for x in v):
            return False
    if isinstance(v, str) and not s.get("minLength", 0) <= len(v) <= s.get("maxLength", 1 << 30):
        return False
    if is_num(v):
        d = Decimal(v)
        lo, hi = s.get("minimum"), s.get("maximum")
        elo, ehi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        if lo is not None and d < Decimal(str(lo)) or hi is not None and d > Decimal(str(hi)):
            return False
        if elo is not None and not isinstance(elo, bool) and d <= Decimal(str(elo)):
            return False
        if ehi is not None and not isinstance(ehi, bool) and d >= Decimal(str(ehi)):
            return False
    return True


def parses_and_validates(schema, text):
    try:
        v = json.loads(text, parse_float=Decimal)
    except ValueError:
        return False
    return valid(schema, v, schema)


# ---- random schemas whose instances stay short ----

def gen_literal(rng):
    return rng.choice(["a", "b c", "\u00e9t\u00e9", "", 0, 7, -3, 1.5, None, True, False, [1, 2], {"k": "v"}])


def gen_schema(rng, depth, max_depth):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    if depth < max_depth:
        kinds += ["array", "object", "object", "anyOf"]
    k = rng.choice(kinds)
    if k == "string":
        mx = rng.randint(0, 8)
        return {"type": "string", "maxLength": mx, **({"minLength": rng.randint(0, mx)} if rng.random() < 0.3 else {})}
    if k == "integer":
        lo = rng.randint(-50, 50)
        return rng.choice([{"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 200)},
                           {"type": "integer", "exclusiveMinimum": lo, "exclusiveMaximum": lo + rng.randint(2, 30)},
                           {"type": "integer", "minimum": 0, "maximum": 9}])
    if k == "number":
        lo = round(rng.uniform(-5, 5), 2)
        return rng.choice([{"type": "number", "minimum": lo, "maximum": round(lo + rng.uniform(0, 3), 2)},
                           {"type": "number", "minimum": -0.5, "maximum": 0.25}, {"type": "number"}])
    if k in ("boolean", "null"):
        return {"type": k}
    if k == "enum":
        vals = []
        for _ in range(rng.randint(1, 4)):
            x = gen_literal(rng)
            if not any(same(x, y) for y in vals):
                vals.append(x)
        return {"enum": vals}
    if k == "const":
        return {"const": gen_literal(rng)}
    if k == "array":
        mx = rng.randint(0, 2)
        return {"type": "array", "items": gen_schema(rng, depth + 1, max_depth), "maxItems": mx,
                **({"minItems": rng.randint(0, mx)} if rng.random() < 0.5 else {})}
    if k == "anyOf":
        return {"anyOf": [gen_schema(rng, depth + 1, max_depth) for _ in range(rng.randint(2, 3))]}
    names = rng.sample(["id", "name", "tags", "x", "y", "ok", "\u043a\u043b\u044e\u0447", "a\"b"], rng.randint(1, 3))
    props = {n: gen_schema(rng, depth + 1, max_depth) for n in names}
    out = {"type": "object", "properties": props, "required": [n for n in names if rng.random() < 0.6]}
    if rng.random() < 0.5:
        out["additionalProperties"] = False
    return out


def gen_top(rng, max_depth):
    s = gen_schema(rng, 0, max_depth)
    if rng.random() < 0.25:  # through $defs and $ref
        return {"$defs": {"item": s}, "type": "object", "properties": {"item": {"$ref": "#/$defs/item"}},
                "required": ["item"]}
    return s


# ---- helpers ----

def chat(messages, **kw):
    return {"model": "m", "messages": messages, **kw}


def user(text="Answer."):
    return [{"role": "user", "content": text}]


def post(srv, path, body, timeout=120):
    st, data, _ = srv.post(path, body, timeout=timeout)
    return st, json.loads(data) if data else None


def outputs(path, resp):
    """(text, finish_reason) of each choice."""
    out = []
    for c in resp["choices"]:
        text = c["message"]["content"] if path.endswith("chat/completions") else c["text"]
        out.append((text, c["finish_reason"]))
    return out


def streamed_outputs(path, srv, body):
    st, events, done, _ = stream(srv, {**body, "stream": True, "_path": path}, timeout=120)
    if st != 200 or not done:
        return None
    texts, finish = {}, {}
    for e in events:
        for c in e.get("choices", []):
            i = c["index"]
            piece = c.get("delta", {}).get("content") if path.endswith("chat/completions") else c.get("text")
            texts[i] = texts.get(i, "") + (piece or "")
            if c.get("finish_reason"):
                finish[i] = c["finish_reason"]
    return [(texts.get(i, ""), finish.get(i)) for i in sorted(set(texts) | set(finish))]


# ---- tests ----

def test_random_schemas(servers):
    """200 requests with random schemas: every output ends by itself and validates."""
    rng = random.Random(27)
    jobs = []
    for i in range(200):
        srv = servers["stories"] if servers.get("stories") and i % 5 >= 3 else servers["demo"]
        small = srv is servers.get("stories")
        schema = gen_top(rng, 1 if small else 2)
        path = "/v1/chat/completions" if i % 2 else "/v1/completions"
        body = {"model": "m", "max_tokens": 450 if small else 1500, "seed": i,
                "temperature": 0 if i % 7 == 0 else round(rng.uniform(0.6, 1.2), 2), "n": 2 if i % 6 == 1 else 1}
        if path.endswith("chat/completions"):
            body["messages"] = user(f"Give me JSON number {i}.")
        else:
            body["prompt"] = rng.choice(["Once upon a time", "{", "Tom had a", "x"])
        which = i % 4
        if which == 0:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema,
                                                                              "strict": True}}
        elif which == 1:
            body["guided_json"] = schema if i % 8 == 1 else json.dumps(schema)
        elif which == 2:
            body["structured_outputs"] = {"json": schema}
        else:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        jobs.append((srv, path, body, schema, i % 9 == 4))

    def run(job):
        srv, path, body, schema, streamed = job
        if streamed:
            return job, streamed_outputs(path, srv, body)
        st, resp = post(srv, path, body)
        return job, outputs(path, resp) if st == 200 else None

    bad, n_out = [], 0
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        for job, outs in ex.map(run, jobs, timeout=600):
            srv, path, body, schema, streamed = job
            if outs is None or len(outs) != body["n"]:
                bad.append(("no response", body))
                continue
            for text, finish in outs:
                n_out += 1
                if finish != "stop" or not parses_and_validates(schema, text):
                    bad.append((finish, text[:300], json.dumps(schema)[:300]))
    check(f"random schemas: {len(jobs)} requests, {n_out} outputs end by themselves and validate", not bad and n_out > 200,
          bad[:3])


def test_formats(servers):
    srv = servers["demo"]
    for path in ("/v1/completions", "/v1/chat/completions"):
        base = {"model": "m", "max_tokens": 1500, "seed": 3}
        base.update({"messages": user()} if "chat" in path else {"prompt": "Hi"})
        st, r = post(srv, path, {**base, "response_format": {"type": "json_object"}, "n": 3})
        ok = st == 200 and all(f == "stop" and isinstance(json.loads(t), dict) for t, f in outputs(path, r))
        check(f"json_object on {path}: any JSON object, three choices", ok, r)
        st, r = post(srv, path, {**base, "structured_outputs": {"json_object": True}})
        check(f"structured_outputs json_object on {path}", st == 200 and isinstance(json.loads(outputs(path, r)[0][0]), dict), r)
        st, r = post(srv, path, {**base, "response_format": {"type": "text"}, "max_tokens": 30, "ignore_eos": True})
        check(f"response_format text on {path}: unconstrained", st == 200 and outputs(path, r)[0][1] == "length", r)
    # stop strings apply to structured output too (as in vLLM): the text ends before the stop string
    st, r = post(srv, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 500, "seed": 2, "stop": ["["],
                                          "guided_json": {"type": "array", "items": {"type": "integer"}}})
    c0 = r["choices"][0] if st == 200 else {}
    check("stop strings apply to structured output", st == 200 and c0["finish_reason"] == "stop"
          and c0["stop_reason"] == "[" and c0["text"].strip() == "", r)
    # min_tokens and ignore_eos do not push a complete text further
    st, r = post(srv, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 400, "min_tokens": 300,
                                          "ignore_eos": True, "seed": 1, "guided_json": {"type": "boolean"}})
    ok = st == 200 and r["choices"][0]["finish_reason"] == "stop" and json.loads(r["choices"][0]["text"]) in (True, False)
    check("a complete text ends the choice despite min_tokens and ignore_eos", ok and r["usage"]["completion_tokens"] < 300, r)


def test_bad_schemas(servers):
    srv = servers["demo"]
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "string",
                                                                                              "pattern": "^a$"}}}},
         "response_format", "pattern"),
        ({"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}}, "guided_json", "nope"),
        ({"guided_json": {"type": "integer", "minimum": 5, "maximum": 1}}, "guided_json", "minimum"),
        ({"guided_json": "{\"type\": "}, "guided_json", "JSON"),
        ({"structured_outputs": {"json": {"type": "thing"}}}, "structured_outputs", "type"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": {
            "type": "string", "maxLength": 1000000}}}}, "response_format", "larger than"),
        ({"response_format": {"type": "xml"}}, "response_format", "xml"),
        ({"guided_json": {"anyOf": [{"const": f"abcdefgh{i}"} for i in range(1100)]}}, "guided_json", "alternatives"),
    ]
    for extra, param, needle in cases:
        st, data, _ = srv.post("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 5, **extra}, timeout=60)
        body = json.loads(data) if data else {}
        msg = body.get("error", {}).get("message", "")
        check(f"bad schema ({needle}): 400 naming {param}",
              st == 400 and error_shape_ok(data) and body["error"]["param"] == param and needle.lower() in msg.lower(),
              (st, data[:300]))
    check("bad schemas: server still healthy", srv.get("/health")[0] == 200)
    # over the run-time limits only once generating (1100 alternatives alive after "["): that request
    # fails with a clear error, one alongside it is served
    many = {"type": "array", "items": {"anyOf": [{"const": f"abcdefgh{i}"} for i in range(1100)]}}
    jobs = [{"model": "m", "prompt": "x", "max_tokens": 50, "guided_json": many, "seed": 1},
            {"model": "m", "prompt": "x", "max_tokens": 500, "guided_json": {"type": "boolean"}, "seed": 1}]
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        (st1, r1), (st2, r2) = ex.map(lambda b: post(srv, "/v1/completions", b), jobs, timeout=120)
    check("a grammar over its run-time limits fails that request only, with a clear error",
          st1 == 500 and "grammar's limits" in r1["error"]["message"] and st2 == 200
          and json.loads(r2["choices"][0]["text"]) in (True, False), (st1, r1, st2, r2))
    st, events, done, _ = stream(srv, {**jobs[0], "stream": True})
    check("... streamed: an error event, then [DONE]", st == 200 and done and "error" in events[-1], events[-2:])
    check("... and the server stays healthy", srv.get("/health")[0] == 200)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "strict": True,
                                      "parameters": {"type": "object", "additionalProperties": False,
                                                     "properties": {"city": {"type": "string", "maxLength": 12},
                                                                    "days": {"type": "integer", "minimum": 1,
                                                                             "maximum": 7}},
                                                     "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"$ref": "#/$defs/tz"}}, "required": ["tz"],
        "$defs": {"tz": {"enum": ["UTC", "CET", "PST"]}}}}},
    {"type": "function", "function": {"name": "ping"}},
]
PARAMS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object", "properties": {}}) for t in TOOLS}


def calls_valid(calls):
    for c in calls:
        if c.get("type") != "function" or not c.get("id") or c["function"]["name"] not in PARAMS:
            return False
        if not parses_and_validates(PARAMS[c["function"]["name"]], c["function"]["arguments"]):
            return False
    return True


def reassemble(events):
    """The streamed tool calls of choice 0 (by index), its content and finish_reason."""
    calls, content, finish = {}, "", None
    for e in events:
        for c in e.get("choices", []):
            d = c.get("delta", {})
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                cur = calls.setdefault(tc["index"], {"id": None, "type": None, "function": {"name": "", "arguments": ""}})
                cur["id"] = tc.get("id") or cur["id"]
                cur["type"] = tc.get("type") or cur["type"]
                cur["function"]["name"] += tc.get("function", {}).get("name") or ""
                cur["function"]["arguments"] += tc.get("function", {}).get("arguments") or ""
            finish = c.get("finish_reason") or finish
    return [calls[k] for k in sorted(calls)], content, finish


def test_tools(servers):
    for label in ("demo", "qwen3", "stories"):
        srv = servers.get(label)
        if not srv:
            continue
        mt = 450 if label == "stories" else 1500
        bad, n_checked = [], 0
        for seed in range(6):
            for choice, parallel in (("required", False), ("required", True),
                                     ({"type": "function", "function": {"name": "get_time"}}, True)):
                body = chat(user("What is the weather in Paris?"), tools=TOOLS, tool_choice=choice,
                            parallel_tool_calls=parallel, max_tokens=mt, seed=seed, temperature=0.9)
                st, r = post(srv, "/v1/chat/completions", body)
                c0 = r["choices"][0] if st == 200 else {}
                msg, finish = c0.get("message", {}), c0.get("finish_reason")
                calls = msg.get("tool_calls") or []
                # with parallel calls a model may call on until max_tokens: then the last call may be cut
                whole = calls if finish == "tool_calls" else calls[:-1]
                ok = (st == 200 and calls and calls_valid(whole) and (parallel or len(calls) == 1)
                      and (finish == "tool_calls" and msg.get("content") is None or finish == "length" and parallel)
                      and (isinstance(choice, str) or all(c["function"]["name"] == "get_time" for c in calls)))
                if not ok:
                    bad.append((choice, parallel, st, r))
                    continue
                n_checked += 1
                if seed < 3:  # the same request streamed: the deltas reassemble into these calls
                    st2, events, done, _ = stream(srv, {**body, "stream": True, "_path": "/v1/chat/completions"})
                    scalls, content, sfinish = reassemble(events)
                    same_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in scalls] == \
                                 [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
                    if not (st2 == 200 and done and sfinish == finish and same_calls and content == (msg["content"] or "")
                            and all(c["id"] and c["type"] == "function" for c in scalls)):
                        bad.append(("stream", choice, scalls, calls, sfinish, content))
        check(f"tools on {label}: required and named are enforced, arguments validate, streamed = not streamed "
              f"({n_checked} requests)", not bad and n_checked == 18, bad[:2])
        st, r = post(srv, "/v1/chat/completions", chat(user(), tools=TOOLS, max_tokens=60, seed=1))
        c0 = r["choices"][0] if st == 200 else {}
        ok = st == 200 and (c0["finish_reason"] != "tool_calls" or calls_valid(c0["message"].get("tool_calls", [])))
        check(f"tools on {label}: auto answers in text or calls", ok, r)
        st, data, _ = srv.post("/v1/chat/completions", chat(user(), tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "format": "email",
                                                                               "pattern": "@"}}}}}],
            tool_choice="required", max_tokens=5))
        err = json.loads(data).get("error", {})
        check(f"tools on {label}: a tool schema that does not compile is a 400 naming the tool",
              st == 400 and err.get("param") == "tools" and "tools[0].function.parameters" in err.get("message", "")
              and "pattern" in err.get("message", ""), data[:300])


def test_template_gets_tools(servers):
    srv = servers.get("qwen3")
    if not srv:
        return
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    st, r = post(srv, "/tokenize", {"model": "m", "messages": msgs, "tools": TOOLS})
    st2, d = post(srv, "/detokenize", {"model": "m", "tokens": r["tokens"]}) if st == 200 else (st, None)
    text = d["prompt"] if st2 == 200 else ""
    check("qwen3 template: the tools are rendered in the system prompt",
          "<tools>" in text and "\"name\": \"get_weather\"" in text and "\"maxLength\": 12" in text, text[:600])
    check("qwen3 template: an earlier call's arguments reach it as an object",
          "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}" in text, text[-400:])
    st, r = post(srv, "/v1/chat/completions", chat(msgs, tools=TOOLS, max_tokens=5, seed=1))
    check("qwen3 template: a conversation with tool calls and results is served", st == 200, r)


def test_unconstrained_unchanged(servers):
    srv = servers["demo"]
    plain = {"model": "m", "prompt": "The same text", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    st, alone = post(srv, "/v1/completions", plain)
    jobs = [plain] + [{"model": "m", "prompt": f"x{i}", "max_tokens": 1500, "seed": i,
                       "guided_json": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}} for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(9) as ex:
        res = list(ex.map(lambda b: post(srv, "/v1/completions", b), jobs, timeout=300))
    check("an unconstrained request gives the same text alongside constrained ones",
          st == 200 and res[0][0] == 200 and res[0][1]["choices"][0]["text"] == alone["choices"][0]["text"], res[0])
    check("... and the constrained ones validate", all(
        r[0] == 200 and parses_and_validates(jobs[i]["guided_json"], r[1]["choices"][0]["text"])
        for i, r in enumerate(res) if i), [r[1] for r in res[1:3]])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "duoserve"))
    ap.add_argument("--model", default=os.path.join(SHARED, "models", "stories260k"))
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    binary, model = os.path.abspath(args.bin), os.path.normpath(args.model)
    tmp = tempfile.mkdtemp(prefix="duo-structured-")
    servers = {}
    try:
        env = {**os.environ, "DUOSERVE_CACHE": os.path.join(tmp, "cache")}
        p = subprocess.run([binary, "generate", "--prompt-ids", "1", "-n", "1"], env=env, capture_output=True, timeout=60)
        demo = os.path.join(tmp, "cache", "demo-llama-v1")
        check("demo model written", p.returncode == 0 and os.path.isdir(demo), p.stderr[-300:])
        servers["demo"] = Server(binary, demo, "--served-model-name", "m")
        qwen_cfg = os.path.join(SHARED, "tokenizers", "qwen3", "tokenizer_config.json")
        if os.path.exists(qwen_cfg):
            tmpl = os.path.join(tmp, "qwen3.jinja")
            with open(tmpl, "w") as f:
                f.write(json.load(open(qwen_cfg))["chat_template"])
            servers["qwen3"] = Server(binary, demo, "--served-model-name", "m", "--chat-template", tmpl)
        else:
            print(f"  SKIP: {qwen_cfg} not found (the <tool_call> syntax)")
        if os.path.exists(os.path.join(model, "config.json")):
            tmpl = os.path.join(tmp, "ipython.jinja")
            with open(tmpl, "w") as f:  # tools as JSON in the prompt; "ipython" marks Llama 3.1's tool syntax
                f.write("<s>{% if tools %}ipython tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n"
                        "{% endif %}{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
            servers["stories"] = Server(binary, model, "--served-model-name", "m", "--chat-template", tmpl)
        else:
            print(f"  SKIP: {model} not found (the SentencePiece vocabulary)")
        for name, fn in (("random_schemas", test_random_schemas), ("formats", test_formats),
                         ("bad_schemas", test_bad_schemas), ("tools", test_tools),
                         ("template_tools", test_template_gets_tools), ("unconstrained", test_unconstrained_unchanged)):
            if args.k in name:
                print(f"== {name}")
                try:
                    fn(servers)
                except Exception:  # noqa: BLE001
                    check(f"{name}: ran without an exception", False, traceback.format_exc())
        for label, srv in servers.items():
            check(f"server {label}: SIGTERM exits 0", srv.stop() == 0)
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(PASS)} passed, {len(FAIL)} failed")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
