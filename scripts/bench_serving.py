#!/usr/bin/env python3
"""Serving benchmark for any OpenAI-compatible server, after vLLM's benchmark_serving.py.

Python standard library only. It replays a dataset against streaming /v1/completions
(--backend openai, the default) or /v1/chat/completions (--backend openai-chat: the prompt as
one user message, max_completion_tokens) and reports request and token throughput with TTFT,
TPOT, inter-token latency (ITL) and end-to-end latency (E2EL).

Datasets (--dataset FILE):
  * ShareGPT JSON: a list of {"id", "conversations": [{"from", "value"}, ...]}. The prompt is
    the first human turn; the reference output length is the token count of the turn after it
    (the first gpt answer). Files with only the human turn (ShareGPT_V3_..._prompts_only.json)
    need --output-lens-csv or --output-len.
  * JSONL: one {"prompt": "...", "max_tokens": N} object a line (max_tokens optional when
    --output-lens-csv or --output-len is given).

Output lengths, first that applies: --output-len N (fixed); --output-lens-csv FILE (the
column --output-lens-column, default num_decode_tokens; row i goes with the i-th prompt of the
dataset in file order, cycling when the CSV is shorter, so the pairing never depends on the
seed); the dataset's own (JSONL max_tokens, ShareGPT reference answer).

Filter (vLLM's): a prompt is dropped when prompt_len < 4 or output_len < 4 (the latter not for
a fixed --output-len), prompt_len > --max-prompt-len (1024) or prompt_len + output_len >
--max-total-len (2048). Token counts come from the server's POST /tokenize (vLLM shape) when
--tokenizer-dir or --server-tokenize is given; otherwise they are estimated as
ceil(characters / 4), and the run says so. The dataset is shuffled with --seed (like vLLM)
unless --no-shuffle; the first --num-prompts that pass the filter are sent.

Measurement (as vLLM's async_request_openai_completions):
  * TTFT: from sending the request to the first SSE chunk that carries a choice (its text may
    be empty); the usage-only chunk and keep-alive comments do not count, nor (chat) a chunk
    that only announces the assistant role, which a server may send before any token.
  * ITL: the gaps between successive choice-carrying chunks.
  * latency (E2EL): from sending the request to the last choice-carrying chunk.
  * TPOT: (latency - TTFT) / (output_tokens - 1), for requests with more than one token.
  * output tokens: usage.completion_tokens from the final chunk (stream_options.include_usage);
    if a server sends no usage, the number of choice-carrying chunks (flagged in the output).
  * input tokens: usage.prompt_tokens as the server counted them; the dataset's count if absent.
  * benchmark duration: from the first request sent to the last one finished.

Report (as vLLM): --percentile-metrics picks which of ttft, tpot, itl, e2el are reported
(default ttft,tpot,itl), each with mean, median and the --metric-percentiles (default 99).
--goodput ttft:500 tpot:50 e2el:1000 (milliseconds; any subset) adds the request goodput:
requests per second that met every objective (a one-token request's TPOT counts as 0).

Multi-turn replay (--multi-turn), as chat clients send a conversation: each ShareGPT
conversation becomes a chat session over /v1/chat/completions (the openai-chat backend, the
default with this flag). Turn k sends every earlier user turn and the server's own earlier
answers (not the trace's) as messages, then the k-th user turn; the turns of a conversation go
strictly one after the other, conversations run concurrently. --num-prompts counts
conversations, --max-turns N keeps the first N turns of each, --request-rate is the rate at which
conversations start and --max-concurrency caps the conversations (and so the requests) in
flight. A turn's max_completion_tokens is --output-len, else the token count of the trace's
answer to it. The filter applies to each turn with the history estimated from the earlier user
turns and output lengths (the chat template's tokens not counted): a conversation is cut before
its first turn that fails (a reference answer under 4 tokens counts as failing), and dropped when
that is its first. A turn that fails ends its conversation; its later turns are counted as not
sent. The report adds the conversations and turns, TTFT of first and of later turns, and the
prefix cache hit rate: the sum of usage.prompt_tokens_details.cached_tokens over the sum of
prompt tokens of the answers that carry it, and the change of the server's /metrics counters
prefix_cache_hits / prefix_cache_queries (duoserve:, vllm: or gpu_ prefixed, _total or not) over
the run; "n/a" when the server reports neither. --multi-turn-context-len N opens each conversation
with a system message of its own, a document of about N tokens (N words drawn with --seed and the
conversation; its exact token count joins the filter's history), as chat clients send a long system
prompt or a pasted document: the prefix cache's case (ShareGPT's own turns are short). Not with
--output-lens-csv (one length per first-turn prompt), --structured-fraction or a completions backend.

Bounds: each request has --request-timeout (default 600 s, total, enforced on every socket
read); the whole run has --max-duration (default 3600 s), after which requests still in flight
are abandoned (their connections closed) and requests not yet sent are skipped; both are
counted in the report.

Example:
  python3 scripts/bench_serving.py --base-url http://127.0.0.1:8000 \\
      --dataset ../shared/traces/ShareGPT_V3_filtered_1000_prompts_only.json \\
      --output-lens-csv ../shared/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv \\
      --ignore-eos --num-prompts 200 --request-rate 4 --max-concurrency 32 \\
      --result-json result.json
"""

import argparse
import csv
import datetime
import http.client
import json
import math
import os
import queue
import random
import re
import socket
import sys
import threading
import time
import urllib.parse

HUMAN_ROLES = ("human", "user")
GPT_ROLES = ("gpt", "assistant", "chatgpt", "bard", "model")


# ----------------------------------------------------------------------------- HTTP helpers


class Server:
    RETRIES = 2  # further tries of an idempotent call whose connection failed

    def __init__(self, base_url, api_key, timeout):
        u = urllib.parse.urlsplit(base_url if "://" in base_url else "http://" + base_url)
        if u.scheme not in ("http", "https"):
            raise SystemExit(f"bench_serving: --base-url scheme must be http or https, not {u.scheme!r}")
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def connect(self, timeout):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)

    def headers(self, body=False):
        h = {"Accept": "application/json", "User-Agent": "duoserve-bench-serving"}
        if body:
            h["Content-Type"] = "application/json"
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h

    def _exchange(self, method, path, body, headers):
        """One request on a fresh connection; returns (status, body bytes). These calls are
        idempotent (token counts, model list, metrics), so a connection reset, refused or closed
        before the answer is tried again, at most RETRIES times after short pauses, as HTTP
        clients do: a busy server's listen queue may overflow while many connections open at once."""
        for attempt in range(self.RETRIES + 1):
            conn = self.connect(self.timeout)
            try:
                conn.request(method, self.prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except ConnectionError:
                if attempt == self.RETRIES:
                    raise
            finally:
                conn.close()
            time.sleep(0.1 * (attempt + 1))

    def text_call(self, path):
        """GET path; returns the body as text or raises RuntimeError."""
        try:
            status, data = self._exchange("GET", path, None, self.headers())
        except (OSError, http.client.HTTPException) as e:
            raise RuntimeError(f"GET {path}: {type(e).__name__}: {e}")
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {error_message(data)}")
        return data.decode("utf-8", "replace")

    def json_call(self, method, path, obj=None):
        """One non-streaming idempotent request; returns the decoded JSON or raises RuntimeError."""
        body = json.dumps(obj).encode() if obj is not None else None
        try:
            status, data = self._exchange(method, path, body, self.headers(body is not None))
        except (OSError, http.client.HTTPException) as e:
            raise RuntimeError(f"{method} {path}: {type(e).__name__}: {e}")
        if status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {error_message(data)}")
        try:
            return json.loads(data)
        except ValueError:
            raise RuntimeError(f"{method} {path}: response is not JSON: {data[:200]!r}")


def error_message(data):
    """The message of an OpenAI-shaped error body, else the body itself (shortened)."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    try:
        obj = json.loads(data)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            if isinstance(err, dict) and "message" in err:
                return str(err["message"])
            if isinstance(err, str):
                return err
            if "detail" in obj:
                return str(obj["detail"])
    except ValueError:
        pass
    data = data.strip()
    return data[:300] + ("..." if len(data) > 300 else "")


# ----------------------------------------------------------------------------- dataset


def load_dataset(path):
    """-> list of dicts {prompt, ref_text or None, max_tokens or None}, in file order."""
    with open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")
    stripped = text.lstrip()
    items = []
    if stripped.startswith("["):
        data = json.loads(text)
        for conv in data:
            if not isinstance(conv, dict):
                continue
            turns = conv.get("conversations") or conv.get("conversation") or []
            prompt = ref = None
            for i, t in enumerate(turns):
                if isinstance(t, dict) and t.get("from") in HUMAN_ROLES and isinstance(t.get("value"), str):
                    prompt = t["value"]
                    nxt = turns[i + 1] if i + 1 < len(turns) else None
                    if isinstance(nxt, dict) and nxt.get("from") in GPT_ROLES and isinstance(nxt.get("value"), str):
                        ref = nxt["value"]
                    break
            if prompt is not None:
                items.append({"prompt": prompt, "ref_text": ref, "max_tokens": None})
            else:
                items.append(None)  # keeps CSV pairing by position
        return items
    for ln, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise SystemExit(f"bench_serving: {path}:{ln}: not JSON: {e}")
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise SystemExit(f"bench_serving: {path}:{ln}: expected an object with a string 'prompt'")
        mt = obj.get("max_tokens", obj.get("output_len"))
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
            raise SystemExit(f"bench_serving: {path}:{ln}: 'max_tokens' must be a positive integer")
        items.append({"prompt": obj["prompt"], "ref_text": None, "max_tokens": mt})
    return items


def load_output_lens(path, column):
    with open(path, newline="") as f:
        rd = csv.DictReader(f)
        if not rd.fieldnames or column not in rd.fieldnames:
            raise SystemExit(f"bench_serving: {path}: no column {column!r} (columns: {rd.fieldnames})")
        lens = []
        for i, row in enumerate(rd, 2):
            try:
                lens.append(int(float(row[column])))
            except (TypeError, ValueError):
                raise SystemExit(f"bench_serving: {path}:{i}: {column}={row[column]!r} is not a number")
    if not lens:
        raise SystemExit(f"bench_serving: {path}: no rows")
    return lens


class TokenCounter:
    """Token counts from the server's /tokenize, or the 4-characters-per-token estimate."""

    def __init__(self, server, model, use_server, workers):
        self.server = server
        self.model = model
        self.use_server = use_server
        self.workers = workers

    def estimate(self, text):
        return max(1, math.ceil(len(text) / 4))

    def count_many(self, texts):
        if not self.use_server:
            return [self.estimate(t) for t in texts]
        out = [None] * len(texts)
        errors = []
        q = queue.Queue()
        for i, t in enumerate(texts):
            q.put((i, t))

        def work():
            while not errors:
                try:
                    i, t = q.get_nowait()
                except queue.Empty:
                    return
                try:
                    r = self.server.json_call("POST", "/tokenize", {"model": self.model, "prompt": t})
                    if isinstance(r.get("count"), int):
                        out[i] = r["count"]
                    elif isinstance(r.get("tokens"), list):
                        out[i] = len(r["tokens"])
                    else:
                        raise RuntimeError(f"/tokenize answer has neither 'count' nor 'tokens': {str(r)[:200]}")
                except RuntimeError as e:
                    errors.append(str(e))

        ths = [threading.Thread(target=work, daemon=True) for _ in range(min(self.workers, len(texts)))]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        if errors:
            raise SystemExit(f"bench_serving: token counting through the server failed: {errors[0]}")
        return out


def sample_requests(args, items, out_lens_csv, counter):
    """vLLM's ShareGPT sampling: shuffle, count tokens, filter, keep the first num_prompts."""
    cands = []
    for idx, it in enumerate(items):
        if it is None:
            continue
        if args.output_len is not None:
            out_src = ("fixed", args.output_len)
        elif out_lens_csv is not None:
            out_src = ("fixed", out_lens_csv[idx % len(out_lens_csv)])
        elif it["max_tokens"] is not None:
            out_src = ("fixed", it["max_tokens"])
        elif it["ref_text"] is not None:
            out_src = ("ref", it["ref_text"])
        else:
            continue  # no way to know its output length
        cands.append((idx, it["prompt"], out_src))
    if not cands:
        raise SystemExit("bench_serving: no prompt in the dataset has an output length: the file has no "
                         "reference answers or max_tokens; pass --output-lens-csv or --output-len")
    if not args.no_shuffle:
        random.Random(args.seed).shuffle(cands)

    chosen, dropped = [], {"too_short": 0, "prompt_too_long": 0, "total_too_long": 0}
    pos = 0
    batch = max(16, args.num_prompts)
    while pos < len(cands) and len(chosen) < args.num_prompts:
        part = cands[pos:pos + batch]
        pos += len(part)
        texts = [p for _, p, _ in part] + [o[1] for _, _, o in part if o[0] == "ref"]
        counts = counter.count_many(texts)
        ref_counts = iter(counts[len(part):])
        for (idx, prompt, o), plen in zip(part, counts):
            olen = next(ref_counts) if o[0] == "ref" else o[1]
            if len(chosen) >= args.num_prompts:
                break
            if plen < 4 or (olen < 4 and args.output_len is None):
                dropped["too_short"] += 1
                continue
            if plen > args.max_prompt_len:
                dropped["prompt_too_long"] += 1
                continue
            if plen + olen > args.max_total_len:
                dropped["total_too_long"] += 1
                continue
            chosen.append({"index": idx, "prompt": prompt, "prompt_len": plen, "output_len": olen})
    return chosen, dropped, len(cands)


def is_turn(t, roles):
    return isinstance(t, dict) and t.get("from") in roles and isinstance(t.get("value"), str)


def load_conversations(path):
    """--multi-turn: ShareGPT JSON -> list (file order) of conversations, each a list of
    (user text, reference answer or None) from the first human turn on, while human and gpt
    turns alternate; None for a conversation with no human turn."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8")
    if not text.lstrip().startswith("["):
        raise SystemExit(f"bench_serving: --multi-turn needs a ShareGPT JSON dataset (a list of conversations); "
                         f"{path} is not one")
    convs = []
    for conv in json.loads(text):
        turns = (conv.get("conversations") or conv.get("conversation") or []) if isinstance(conv, dict) else []
        i = 0
        while i < len(turns) and not is_turn(turns[i], HUMAN_ROLES):
            i += 1
        pairs = []
        while i < len(turns) and is_turn(turns[i], HUMAN_ROLES):
            nxt = turns[i + 1] if i + 1 < len(turns) else None
            if not is_turn(nxt, GPT_ROLES):
                pairs.append((turns[i]["value"], None))
                break
            pairs.append((turns[i]["value"], nxt["value"]))
            i += 2
        convs.append(pairs or None)
    return convs


CONTEXT_WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
                 "they you were her she there been one all we their has would when if so no what can more out up about "
                 "into them some could him time two may then do first any my now such like our over man me even most "
                 "made after also did many before must through back years where much your way well down should because "
                 "each just those people how too little state good very make world still own see men work long get here "
                 "between both life being under never day same another know while last might us great old year off "
                 "come since against go came right used take three river garden window letter music market island "
                 "engine harvest lantern meadow orbit pepper quarry ribbon saddle timber velvet walnut yacht zephyr").split()


def context_document(args, conv_index):
    """--multi-turn-context-len's document for conversation conv_index: N words drawn with --seed and
    the conversation (its own text, so conversations share no prefix beyond the chat template), or None."""
    n = args.multi_turn_context_len
    if not n:
        return None
    rng = random.Random(f"{args.seed}:{conv_index}")
    words = [rng.choice(CONTEXT_WORDS) for _ in range(n)]
    return f"Document {conv_index}: " + " ".join(words)


def sample_conversations(args, convs, counter):
    """--multi-turn's sampling: shuffle the conversations (unless --no-shuffle), keep each one's
    first --max-turns turns that have an output length, then the filter turn by turn with the
    history estimated from the earlier user turns and output lengths; the first --num-prompts
    conversations with a turn left. -> (conversations: lists of turn dicts, conversations dropped
    by reason, turns cut by the filter, usable conversations)."""
    cands = []
    for idx, pairs in enumerate(convs):
        if not pairs:
            continue
        if args.max_turns:
            pairs = pairs[:args.max_turns]
        if args.output_len is None and pairs[-1][1] is None:
            pairs = pairs[:-1]  # the conversation ends in an unanswered question: no length for it
        if pairs:
            cands.append((idx, pairs))
    if not cands:
        raise SystemExit("bench_serving: no conversation in the dataset has an answered human turn; "
                         "pass --output-len for prompts without reference answers")
    if not args.no_shuffle:
        random.Random(args.seed).shuffle(cands)

    chosen, dropped, turns_cut = [], {"too_short": 0, "prompt_too_long": 0, "total_too_long": 0}, 0
    pos = 0
    batch = max(16, args.num_prompts)
    while pos < len(cands) and len(chosen) < args.num_prompts:
        part = cands[pos:pos + batch]
        pos += len(part)
        docs = [context_document(args, idx) for idx, _ in part]
        texts = [t for _, pairs in part for u, a in pairs for t in ((u,) if args.output_len is not None else (u, a))]
        counts = counter.count_many(texts + [d for d in docs if d])
        doc_lens = iter(counts[len(texts):])
        counts = iter(counts[:len(texts)])
        for (idx, pairs), doc in zip(part, docs):
            lens = [(next(counts), args.output_len if args.output_len is not None else next(counts))
                    for _ in pairs]
            doc_len = next(doc_lens) if doc else 0
            if len(chosen) >= args.num_prompts:
                break
            turns, ctx, reason = [], doc_len, None
            for k, ((user, _), (ulen, olen)) in enumerate(zip(pairs, lens)):
                plen = ctx + ulen  # earlier user turns and answers (at most their output lengths), then this one
                if (k == 0 and plen < 4) or (olen < 4 and args.output_len is None):
                    reason = "too_short"
                elif plen > args.max_prompt_len:
                    reason = "prompt_too_long"
                elif plen + olen > args.max_total_len:
                    reason = "total_too_long"
                if reason:
                    break
                turns.append({"index": idx, "conv": len(chosen), "turn": k, "prompt": user,
                              "prompt_len": plen, "output_len": olen, "context": doc, "context_len": doc_len})
                ctx = plen + olen
            if not turns:
                dropped[reason] += 1
                continue
            turns_cut += len(pairs) - len(turns)
            chosen.append(turns)
    return chosen, dropped, turns_cut, len(cands)


# ----------------------------------------------------------------------------- one request


class Result:
    __slots__ = ("ok", "status", "error", "ttft", "latency", "itl", "output_tokens", "prompt_tokens",
                 "usage_seen", "cached_tokens", "chunks", "text", "start", "end", "sent", "req")

    def __init__(self, req):
        self.req = req
        self.ok = False
        self.status = "pending"  # ok | failed | timeout | abandoned
        self.error = ""
        self.ttft = 0.0
        self.latency = 0.0
        self.itl = []
        self.output_tokens = 0
        self.prompt_tokens = None
        self.usage_seen = False
        self.cached_tokens = None  # usage.prompt_tokens_details.cached_tokens, when the server sends it
        self.chunks = 0
        self.text = []
        self.start = 0.0
        self.end = 0.0
        self.sent = False  # the request went out on the wire


# --structured-body's default: one string field, so the text runs until the model closes the string
STRUCTURED_BODY = {"response_format": {"type": "json_schema", "json_schema": {
    "name": "answer", "schema": {"type": "object", "properties": {"answer": {"type": "string"}},
                                 "required": ["answer"], "additionalProperties": False}}}}


def run_request(server, args, model, req, run_deadline, stop, messages=None):
    """One streamed request; chat requests send `messages` (--multi-turn: the conversation so
    far), else the prompt as one user message."""
    res = Result(req)
    chat = args.backend == "openai-chat"
    body = {"model": model}
    if chat:  # as vLLM's async_request_openai_chat_completions
        body["messages"] = messages if messages is not None else [{"role": "user", "content": req["prompt"]}]
        body["max_completion_tokens"] = req["output_len"]
    else:
        body["prompt"] = req["prompt"]
        body["max_tokens"] = req["output_len"]
    body.update({"temperature": args.temperature, "stream": True, "stream_options": {"include_usage": True}})
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.extra_body:
        body.update(args.extra_body)
    if req.get("structured"):
        body.update(args.structured_body)
    payload = json.dumps(body).encode()

    st = time.perf_counter()
    res.start = st
    req_deadline = st + args.request_timeout
    deadline = min(req_deadline, run_deadline)

    def remaining():
        return deadline - time.perf_counter()

    conn = None
    try:
        if remaining() <= 0:
            raise socket.timeout()
        conn = server.connect(max(0.001, remaining()))
        conn.request("POST", server.prefix + args.endpoint, body=payload, headers=server.headers(True))
        res.sent = True
        # the socket itself: http.client drops conn.sock once a response says Connection: close
        sock = conn.sock
        sock.settimeout(max(0.001, remaining()))
        resp = conn.getresponse()
        if resp.status != 200:
            res.status, res.error = "failed", f"HTTP {resp.status}: {error_message(resp.read())}"
            return res
        last = st
        while True:
            rem = remaining()
            if rem <= 0 or stop.is_set():
                raise socket.timeout()
            sock.settimeout(rem)
            line = resp.readline()
            if not line:
                break  # end of stream
            line = line.strip()
            if not line or line.startswith(b":"):
                continue  # blank separator or SSE comment (keep-alive)
            if not line.startswith(b"data:"):
                continue  # event:/id:/retry: fields are not used
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                obj = json.loads(data)
            except ValueError:
                res.status, res.error = "failed", f"bad SSE data: {data[:200]!r}"
                return res
            if not isinstance(obj, dict):
                continue
            if "error" in obj:
                res.status, res.error = "failed", "error in stream: " + error_message(json.dumps(obj))
                return res
            choices = obj.get("choices")
            c0 = choices[0] if choices and isinstance(choices[0], dict) else {}
            delta = c0.get("delta") if isinstance(c0.get("delta"), dict) else {}
            # chat: the role announcement, which a server may send before any token, is no token
            role_only = chat and "role" in delta and not delta.get("content") and not c0.get("finish_reason")
            if choices and not role_only:
                ts = time.perf_counter()
                if res.chunks == 0:
                    res.ttft = ts - st
                else:
                    res.itl.append(ts - last)
                last = ts
                res.chunks += 1
                if args.keep_text:
                    res.text.append((delta.get("content") if chat else c0.get("text")) or "")
            usage = obj.get("usage")
            if isinstance(usage, dict):
                if isinstance(usage.get("completion_tokens"), int):
                    res.output_tokens = usage["completion_tokens"]
                    res.usage_seen = True
                if isinstance(usage.get("prompt_tokens"), int):
                    res.prompt_tokens = usage["prompt_tokens"]
                details = usage.get("prompt_tokens_details")
                if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                    res.cached_tokens = details["cached_tokens"]
        res.end = time.perf_counter()
        if res.chunks == 0:
            res.status, res.error = "failed", "stream ended without any completion chunk"
            return res
        res.latency = last - st
        if not res.usage_seen:
            res.output_tokens = res.chunks
        res.ok, res.status = True, "ok"
        return res
    except (socket.timeout, TimeoutError):
        if time.perf_counter() >= run_deadline or stop.is_set():
            res.status, res.error = "abandoned", "abandoned at the end of --max-duration"
        else:
            res.status, res.error = "timeout", f"no complete answer within --request-timeout {args.request_timeout:g} s"
        return res
    except (OSError, http.client.HTTPException) as e:
        res.status, res.error = "failed", f"{type(e).__name__}: {e}"
        return res
    finally:
        if not res.end:
            res.end = time.perf_counter()
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass


# ----------------------------------------------------------------------------- the run


def percentile(xs, q):
    """numpy.percentile's default (linear interpolation)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# --percentile-metrics names, in report order: (short name, section title)
METRICS = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
           "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def stats_ms(xs, percentiles):
    """Mean, median, std and the given percentiles of xs (seconds), in ms; zeros when empty (as vLLM)."""
    xs = xs or [0.0]
    n = len(xs)
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
    return {"mean": mean * 1000, "median": percentile(xs, 50) * 1000, "std": std * 1000,
            "percentiles": [(p, percentile(xs, p) * 1000) for p in percentiles]}


def percentile_name(p):
    """vLLM's label of a percentile: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def parse_goodput(pairs):
    """vLLM's --goodput KEY:VALUE pairs (KEY ttft, tpot or e2el; VALUE milliseconds >= 0) -> {KEY: seconds}."""
    slos = {}
    for pair in pairs:
        name, sep, val = pair.partition(":")
        try:
            ms = float(val) if sep else None
        except ValueError:
            ms = None
        if ms is None:
            raise ValueError(f"--goodput {pair!r}: give KEY:VALUE pairs, the value in milliseconds (e.g. ttft:500)")
        if name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput {pair!r}: the metric must be one of {', '.join(GOODPUT_METRICS)}")
        if not (0 <= ms < math.inf):
            raise ValueError(f"--goodput {pair!r}: the value must be a non-negative number of milliseconds")
        slos[name] = ms / 1000.0
    return slos


def meets_slos(r, slos):
    """Whether a finished request meets every goodput objective (TPOT counts as 0 for one token, as vLLM)."""
    tpot = (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
    got = {"ttft": r.ttft, "tpot": tpot, "e2el": r.latency}
    return all(got[k] <= v for k, v in slos.items())


def benchmark(server, args, model, jobs):
    """Sends the jobs (each a list of turns: one request, or a --multi-turn conversation whose
    turns go one after the other, each with the answers so far) and collects a Result a turn.
    -> (results, duration, turns not sent, turns unfinished at the cut-off, interrupted,
    turns that went out on the wire)."""
    n_jobs = len(jobs)
    n = sum(len(j) for j in jobs)
    conc = args.max_concurrency if args.max_concurrency else n_jobs
    conc = max(1, min(conc, n_jobs))
    rate = args.request_rate
    rng = random.Random(args.seed)
    stop = threading.Event()
    work = queue.Queue()
    results = []
    lock = threading.Lock()
    done_cv = threading.Condition(lock)
    count = {"jobs_started": 0, "jobs_done": 0, "turns_started": 0}
    t0 = time.perf_counter()
    run_deadline = t0 + args.max_duration
    progress_every = max(1, n // 10)
    what = "turns" if args.multi_turn else "requests"

    def run_job(job):
        history = [{"role": "system", "content": job[0]["context"]}] if job and job[0].get("context") else []
        for k, rq in enumerate(job):
            # a later turn waits for the answer before it; none starts past the deadline
            if k > 0 and (stop.is_set() or time.perf_counter() >= run_deadline):
                return
            messages = history + [{"role": "user", "content": rq["prompt"]}] if args.multi_turn else None
            with lock:
                count["turns_started"] += 1
            try:
                r = run_request(server, args, model, rq, run_deadline, stop, messages)
            except Exception as e:  # noqa: BLE001 (a bug must not leave the run waiting for this answer)
                r = Result(rq)
                r.status, r.error, r.end = "failed", f"{type(e).__name__}: {e}", time.perf_counter()
            with done_cv:
                results.append(r)
                k_done = len(results)
                done_cv.notify_all()
            if not args.quiet and (k_done % progress_every == 0 or k_done == n):
                print(f"  {k_done}/{n} {what} done ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
            if not r.ok:
                return  # the conversation cannot go on without this answer
            if messages is not None:
                history = messages + [{"role": "assistant", "content": "".join(r.text)}]

    def worker():
        while True:
            job = work.get()
            if job is None:
                return
            with lock:
                count["jobs_started"] += 1
            try:
                run_job(job)
            finally:
                with done_cv:
                    count["jobs_done"] += 1
                    done_cv.notify_all()

    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{i}") for i in range(conc)]
    for t in threads:
        t.start()

    queued = 0
    interrupted = False
    try:
        # Arrivals as vLLM's get_request: the first at once, then gamma(burstiness) gaps with
        # mean 1/rate (exponential, i.e. Poisson arrivals, for burstiness 1). With
        # --max-concurrency the arrived jobs wait (FIFO) for a free slot; their TTFT
        # is measured from when they are actually sent. A --multi-turn conversation arrives
        # as a whole: its later turns follow its answers, not the clock.
        next_t = t0
        for i, job in enumerate(jobs):
            if i > 0 and not math.isinf(rate):
                theta = 1.0 / (rate * args.burstiness)
                next_t += rng.gammavariate(args.burstiness, theta)
                while True:
                    now = time.perf_counter()
                    if now >= next_t or now >= run_deadline:
                        break
                    time.sleep(min(next_t, run_deadline) - now)
            if time.perf_counter() >= run_deadline:
                break
            work.put(job)
            queued += 1
        for _ in threads:
            work.put(None)
        # Wait for the answers; the workers enforce the deadlines on every socket read, the
        # grace here only covers a connect or a read already in progress.
        with done_cv:
            while count["jobs_done"] < queued:
                left = run_deadline + 2.0 - time.perf_counter()
                if left <= 0:
                    break
                done_cv.wait(min(left, 1.0))
    except KeyboardInterrupt:
        interrupted = True
        print("bench_serving: interrupted; reporting what finished", file=sys.stderr)
    stop.set()
    with lock:
        final = list(results)
        # unfinished: turns in flight at the cut-off, and the first turn of each queued job no
        # worker took up; the other turns never went out
        n_unfinished = count["turns_started"] - len(final) + queued - count["jobs_started"]
    # benchmark duration: first request sent to last one finished (or to the cut-off)
    end = max([r.end for r in final], default=t0)
    if n_unfinished or any(r.status == "abandoned" for r in final):
        end = max(end, min(time.perf_counter(), run_deadline))
    duration = max(end - t0, 1e-9)
    n_unsent = n - len(final) - n_unfinished
    turns_sent = count["turns_started"] - sum(1 for r in final if not r.sent)
    return final, duration, n_unsent, n_unfinished, interrupted, turns_sent


def summarize(args, results, duration, n_unsent, n_unfinished):
    """The run's numbers, as vLLM's calculate_metrics (plus what did not finish)."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if r.status in ("failed", "timeout")]
    abandoned = [r for r in results if r.status == "abandoned"]
    in_lens = [r.prompt_tokens if r.prompt_tokens is not None else r.req["prompt_len"] for r in ok]
    out_lens = [r.output_tokens for r in ok]
    samples = {"ttft": [r.ttft for r in ok],
               "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
               "itl": [g for r in ok for g in r.itl],
               "e2el": [r.latency for r in ok]}
    first_error = None
    for r in sorted(failed + abandoned, key=lambda r: r.end):
        first_error = r.error
        break
    return {
        "results": results, "ok": ok, "failed": failed, "duration": duration,
        "n_abandoned": len(abandoned) + n_unfinished, "n_unsent": n_unsent,
        "in_lens": in_lens, "out_lens": out_lens, "total_in": sum(in_lens), "total_out": sum(out_lens),
        "prompt_est": sum(1 for r in ok if r.prompt_tokens is None), "out_est": sum(1 for r in ok if not r.usage_seen),
        "samples": samples,
        "stats": {k: stats_ms(v, args.metric_percentiles) for k, v in samples.items()},
        "goodput": (sum(1 for r in ok if meets_slos(r, args.goodput)) / duration) if args.goodput else None,
        "first_error": first_error,
    }


def cache_hit_rate(results):
    """Sum of usage cached_tokens over the sum of prompt tokens of the answers that carry it; None if none does."""
    rs = [r for r in results if r.cached_tokens is not None and r.prompt_tokens is not None]
    prompt = sum(r.prompt_tokens for r in rs)
    return sum(r.cached_tokens for r in rs) / prompt if prompt else None


def summarize_multi_turn(args, run, jobs, turns_sent, cache_before, cache_after):
    """--multi-turn's numbers: conversations, turns, TTFT of first and later turns, prefix cache hit rates."""
    ok = run["ok"]
    ok_turns = {}
    for r in ok:
        ok_turns[r.req["conv"]] = ok_turns.get(r.req["conv"], 0) + 1
    first = [r.ttft for r in ok if r.req["turn"] == 0]
    later = [r.ttft for r in ok if r.req["turn"] > 0]
    metrics = None
    if cache_before and cache_after and cache_after["queries"] > cache_before["queries"]:
        metrics = (cache_after["hits"] - cache_before["hits"]) / (cache_after["queries"] - cache_before["queries"])
    return {
        "conversations": len(jobs),
        "context_tokens_mean": sum(j[0]["context_len"] for j in jobs) / len(jobs) if jobs else 0.0,
        "conversations_completed": sum(1 for j in jobs if ok_turns.get(j[0]["conv"], 0) == len(j)),
        "turns_planned": sum(len(j) for j in jobs),
        "turns_sent": turns_sent,
        "turns_first": len(first), "turns_later": len(later),
        "ttft_first": stats_ms(first, args.metric_percentiles) if first else None,
        "ttft_later": stats_ms(later, args.metric_percentiles) if later else None,
        "cached_usage": sum(1 for r in ok if r.cached_tokens is not None),
        "hit_rate_usage": cache_hit_rate(ok),
        "hit_rate_usage_later": cache_hit_rate([r for r in ok if r.req["turn"] > 0]),
        "cache_counters": (None if not (cache_before and cache_after) else
                           {k: cache_after[k] - cache_before[k] for k in ("queries", "hits")}),
        "hit_rate_metrics": metrics,
    }


# /metrics counters of prefix cache lookups, in tokens (vLLM's vllm:prefix_cache_queries / _hits)
PREFIX_CACHE_RE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*:)?(?:gpu_)?prefix_cache_(queries|hits)(?:_total)?"
                             r"(?:\{[^}]*\})?\s+(\S+)")


def prefix_cache_counters(server):
    """The server's prefix cache counters from GET /metrics, each summed over its label sets:
    {"queries": q, "hits": h}, or None when the server has no such counters or no /metrics."""
    try:
        text = server.text_call("/metrics")
    except RuntimeError:
        return None
    got = {}
    for line in text.splitlines():
        m = PREFIX_CACHE_RE.match(line)
        if m:
            try:
                got[m.group(1)] = got.get(m.group(1), 0.0) + float(m.group(2))
            except ValueError:
                continue
    return got if len(got) == 2 else None


def print_report(args, run, interrupted, mt=None):
    w, dur = 40, run["duration"]
    line = "{:<{w}} {:<10}".format
    num = "{:<{w}} {:<10.2f}".format
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print(line("Successful requests:", len(run["ok"]), w=w))
    if run["failed"]:
        print(line("Failed requests:", len(run["failed"]), w=w))
    if run["n_abandoned"] or run["n_unsent"]:
        print(line("Abandoned requests (unfinished at end):", run["n_abandoned"], w=w))
        print(line("Requests not sent (time ran out):" if mt is None else
                   "Turns not sent (time, or a turn failed):", run["n_unsent"], w=w))
    print(num("Benchmark duration (s):", dur, w=w))
    print(line("Total input tokens:", run["total_in"], w=w))
    print(line("Total generated tokens:", run["total_out"], w=w))
    print(num("Request throughput (req/s):", len(run["ok"]) / dur, w=w))
    if run["goodput"] is not None:
        print(num("Request goodput (req/s):", run["goodput"], w=w))
    print(num("Output token throughput (tok/s):", run["total_out"] / dur, w=w))
    st_ok = [r for r in run["ok"] if r.req.get("structured")]
    if any(r.req.get("structured") for r in run["results"]):
        print(line("Structured requests (ok):", len(st_ok), w=w))
        print(line("Structured output tokens:", sum(r.output_tokens for r in st_ok), w=w))
    print(num("Total Token throughput (tok/s):", (run["total_in"] + run["total_out"]) / dur, w=w))
    for key, (name, title) in METRICS.items():
        if key not in args.percentile_metrics:
            continue
        st = run["stats"][key]
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        print(num(f"Mean {name} (ms):", st["mean"], w=w))
        print(num(f"Median {name} (ms):", st["median"], w=w))
        for p, v in st["percentiles"]:
            print(num(f"P{percentile_name(p)} {name} (ms):", v, w=w))
    if mt is not None:
        print_multi_turn(mt, w)
    print("=" * 50)
    if run["prompt_est"]:
        print(f"note: {run['prompt_est']} requests had no usage.prompt_tokens; "
              "their input tokens are the dataset's count")
    if run["out_est"]:
        print(f"note: {run['out_est']} requests had no usage.completion_tokens; their output tokens are chunk counts")
    if run["first_error"]:
        print(f"First error: {run['first_error']}")
    if interrupted:
        print("note: the run was interrupted (Ctrl-C)")


def print_multi_turn(mt, w):
    line = "{:<{w}} {:<10}".format
    num = "{:<{w}} {:<10.2f}".format

    def rate(x):
        return "n/a" if x is None else f"{x:.4f}"

    print("{s:{c}^{n}}".format(s="Multi-turn Conversations", n=50, c="-"))
    print(line("Conversations:", mt["conversations"], w=w))
    if mt["context_tokens_mean"]:
        print(num("Context document tokens (mean):", mt["context_tokens_mean"], w=w))
    print(line("Conversations completed (every turn):", mt["conversations_completed"], w=w))
    print(line("Turns sent:", mt["turns_sent"], w=w))
    print(line("Turns ok (first / later):", f"{mt['turns_first']} / {mt['turns_later']}", w=w))
    for key, title in (("ttft_first", "first turns"), ("ttft_later", "later turns")):
        st = mt[key]
        if st is None:
            print(line(f"TTFT of {title} (ms):", "n/a", w=w))
            continue
        print(num(f"Mean TTFT {title} (ms):", st["mean"], w=w))
        print(num(f"Median TTFT {title} (ms):", st["median"], w=w))
        for p, v in st["percentiles"]:
            print(num(f"P{percentile_name(p)} TTFT {title} (ms):", v, w=w))
    print(line("Prefix cache hit rate (usage):", rate(mt["hit_rate_usage"]), w=w))
    print(line("  later turns only:", rate(mt["hit_rate_usage_later"]), w=w))
    print(line("Prefix cache hit rate (/metrics):", rate(mt["hit_rate_metrics"]), w=w))
    if mt["hit_rate_usage"] is not None and mt["cached_usage"] < mt["turns_first"] + mt["turns_later"]:
        print(f"note: only {mt['cached_usage']} answers carried usage.prompt_tokens_details.cached_tokens")


def write_result_json(args, run, model, reqs, dropped, use_server_tok, interrupted, mt=None):
    ok, dur = run["ok"], run["duration"]
    res = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": args.backend,
        "base_url": args.base_url,
        "endpoint": args.endpoint,
        "model_id": model,
        "tokenizer_id": args.tokenizer_dir,
        "token_counts": "server /tokenize" if use_server_tok else "estimated chars/4",
        "dataset": args.dataset,
        "output_lens_csv": args.output_lens_csv,
        "num_prompts": len(reqs),
        "num_prompts_requested": args.num_prompts,
        "filter_dropped": dropped,
        "max_prompt_len": args.max_prompt_len,
        "max_total_len": args.max_total_len,
        "request_rate": args.request_rate if not math.isinf(args.request_rate) else "inf",
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "ignore_eos": args.ignore_eos,
        "temperature": args.temperature,
        "seed": args.seed,
        "request_timeout": args.request_timeout,
        "max_duration": args.max_duration,
        "ttft_definition": "first chunk with a choice (text may be empty; a chat role-only chunk does not count)",
        "duration": dur,
        "completed": len(ok),
        "failed": len(run["failed"]),
        "abandoned": run["n_abandoned"],
        "not_sent": run["n_unsent"],
        "first_error": run["first_error"],
        "interrupted": interrupted,
        "total_input_tokens": run["total_in"],
        "total_output_tokens": run["total_out"],
        "request_throughput": len(ok) / dur,
        "request_goodput": run["goodput"],
        "goodput_slos_ms": {k: v * 1000 for k, v in args.goodput.items()} or None,
        "output_throughput": run["total_out"] / dur,
        "total_token_throughput": (run["total_in"] + run["total_out"]) / dur,
    }
    for key in METRICS:
        if key not in args.percentile_metrics:
            continue
        st = run["stats"][key]
        for name in ("mean", "median", "std"):
            res[f"{name}_{key}_ms"] = st[name]
        for p, v in st["percentiles"]:
            res[f"p{percentile_name(p)}_{key}_ms"] = v
    res["multi_turn"] = mt is not None
    if mt is not None:
        res.update({"conversations": mt["conversations"], "conversations_completed": mt["conversations_completed"],
                    "max_turns": args.max_turns, "turns_planned": mt["turns_planned"],
                    "turns_cut_by_filter": mt["turns_cut"], "turns_sent": mt["turns_sent"],
                    "turns_not_sent": run["n_unsent"], "turns_ok_first": mt["turns_first"],
                    "turns_ok_later": mt["turns_later"]})
        for key, prefix in (("ttft_first", "first_turn"), ("ttft_later", "later_turns")):
            st = mt[key]
            for name in ("mean", "median", "std"):
                res[f"{prefix}_{name}_ttft_ms"] = st[name] if st else None
            for p in args.metric_percentiles:
                res[f"{prefix}_p{percentile_name(p)}_ttft_ms"] = dict(st["percentiles"])[p] if st else None
        res.update({"prefix_cache_hit_rate_usage": mt["hit_rate_usage"],
                    "prefix_cache_hit_rate_usage_later_turns": mt["hit_rate_usage_later"],
                    "answers_with_cached_tokens": mt["cached_usage"],
                    "prefix_cache_hit_rate_metrics": mt["hit_rate_metrics"],
                    "prefix_cache_counters_delta": mt["cache_counters"]})
    if args.save_detailed:
        res["input_lens"] = run["in_lens"]
        res["output_lens"] = run["out_lens"]
        res["requested_output_lens"] = [r.req["output_len"] for r in ok]
        res["ttfts"] = run["samples"]["ttft"]
        res["itls"] = [r.itl for r in ok]
        res["e2els"] = run["samples"]["e2el"]
        res["generated_texts"] = ["".join(r.text) for r in ok]
        if mt is not None:
            res["turns"] = [[r.req["conv"], r.req["turn"]] for r in ok]  # (conversation, turn) of each above
            res["prompt_tokens"] = [r.prompt_tokens for r in ok]
            res["cached_tokens"] = [r.cached_tokens for r in ok]
        res["errors"] = [r.error for r in sorted(run["results"], key=lambda r: r.start) if not r.ok]
    tmp = args.result_json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    os.replace(tmp, args.result_json)
    print(f"Results written to {args.result_json}")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default %(default)s)")
    ap.add_argument("--backend", default=None, choices=("openai", "vllm", "openai-chat"),
                    help="openai (or vllm): streaming /v1/completions; openai-chat: streaming /v1/chat/completions, "
                         "the prompt as one user message (default openai; openai-chat with --multi-turn)")
    ap.add_argument("--endpoint", default=None,
                    help="API path (default /v1/completions, /v1/chat/completions for openai-chat)")
    ap.add_argument("--model", help="model id (default: the first id from GET /v1/models)")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                    help="sent as Authorization: Bearer KEY (default $OPENAI_API_KEY)")
    ap.add_argument("--dataset", required=True, help="ShareGPT JSON or JSONL of {prompt, max_tokens}")
    ap.add_argument("--num-prompts", type=int, default=1000,
                    help="requests to send; with --multi-turn, conversations (default %(default)s)")
    ap.add_argument("--multi-turn", action="store_true",
                    help="replay each ShareGPT conversation as a chat session: its turns in order, each with the "
                         "server's earlier answers (see above)")
    ap.add_argument("--max-turns", type=int, default=None, metavar="N",
                    help="--multi-turn: the first N turns of each conversation (default: all)")
    ap.add_argument("--multi-turn-context-len", type=int, default=0, metavar="N",
                    help="--multi-turn: open each conversation with a system message of its own, a document of "
                         "about N tokens (N words drawn with --seed and the conversation), as chat clients send "
                         "a long system prompt or a pasted document (default: none)")
    ap.add_argument("--output-lens-csv", help="CSV whose --output-lens-column gives max_tokens per prompt")
    ap.add_argument("--output-lens-column", default="num_decode_tokens", help="(default %(default)s)")
    ap.add_argument("--output-len", type=int, help="fixed max_tokens for every request (overrides the rest)")
    ap.add_argument("--tokenizer-dir", metavar="DIR",
                    help="count prompt/reference tokens exactly for the filter, through the server's POST "
                         "/tokenize (the server's model's tokenizer; DIR is recorded as tokenizer_id)")
    ap.add_argument("--server-tokenize", action="store_true", help="the same as --tokenizer-dir, without a DIR")
    ap.add_argument("--max-prompt-len", type=int, default=1024, help="filter: prompt tokens (default %(default)s)")
    ap.add_argument("--max-total-len", type=int, default=2048,
                    help="filter: prompt + output tokens (default %(default)s; use the server's max_model_len "
                         "when it is smaller)")
    ap.add_argument("--seed", type=int, default=0, help="dataset shuffle and arrival times (default %(default)s)")
    ap.add_argument("--no-shuffle", action="store_true", help="take the dataset in file order")
    ap.add_argument("--request-rate", type=float, default=float("inf"),
                    help="requests per second, Poisson arrivals; inf = all at once (default)")
    ap.add_argument("--burstiness", type=float, default=1.0,
                    help="gamma shape of the arrival gaps; 1 = Poisson (default %(default)s)")
    ap.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most (default: no limit)")
    ap.add_argument("--ignore-eos", action="store_true", help='send "ignore_eos": true (exact output lengths)')
    ap.add_argument("--temperature", type=float, default=0.0, help="(default %(default)s)")
    ap.add_argument("--extra-body", type=json.loads, default=None, help="JSON object merged into every request")
    ap.add_argument("--structured-fraction", type=float, default=0.0, metavar="F",
                    help="share of the requests (spread evenly) sent with --structured-body (default 0)")
    ap.add_argument("--structured-body", type=json.loads, default=STRUCTURED_BODY, metavar="JSON",
                    help="JSON object merged into the structured requests (default: a response_format json_schema "
                         "of one string field)")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default %(default)s)")
    ap.add_argument("--max-duration", type=float, default=3600.0,
                    help="seconds for the whole run; then outstanding requests are abandoned (default %(default)s)")
    ap.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                    help="comma-separated metrics to report (mean, median and --metric-percentiles) of ttft, tpot, "
                         "itl, e2el (default %(default)s)")
    ap.add_argument("--metric-percentiles", default="99",
                    help='comma-separated percentiles of those metrics, e.g. "25,50,75,99.9" (default %(default)s)')
    ap.add_argument("--goodput", nargs="+", metavar="KEY:VALUE", default=None,
                    help="service level objectives in milliseconds, e.g. ttft:500 tpot:50 e2el:1000 (keys ttft, tpot, "
                         "e2el); reports the request goodput: requests/s that met all of them (DistServe)")
    ap.add_argument("--result-json", metavar="FILE", help="write the numbers as JSON")
    ap.add_argument("--save-detailed", action="store_true",
                    help="add per-request lists (input_lens, output_lens, ttfts, itls, e2els, errors) to --result-json")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args()

    if args.num_prompts < 1:
        ap.error("--num-prompts must be >= 1")
    if args.max_turns is not None and not args.multi_turn:
        ap.error("--max-turns needs --multi-turn")
    if args.max_turns is not None and args.max_turns < 1:
        ap.error("--max-turns must be >= 1")
    if args.multi_turn_context_len and not args.multi_turn:
        ap.error("--multi-turn-context-len needs --multi-turn")
    if args.multi_turn_context_len < 0:
        ap.error("--multi-turn-context-len must be >= 0")
    if args.multi_turn:
        if args.backend is None:
            args.backend = "openai-chat"
        elif args.backend != "openai-chat":
            ap.error(f"--multi-turn sends chat messages: it needs --backend openai-chat, not {args.backend} "
                     "(a completions endpoint has no conversation)")
        if args.output_lens_csv:
            ap.error("--multi-turn does not take --output-lens-csv (one length per first-turn prompt); each turn's "
                     "length is its reference answer's, or --output-len")
        if args.structured_fraction > 0:
            ap.error("--multi-turn does not take --structured-fraction (structured answers would become the "
                     "conversation's history)")
    if args.backend is None:
        args.backend = "openai"
    if args.output_len is not None and args.output_len < 1:
        ap.error("--output-len must be >= 1")
    if not (args.request_rate > 0):
        ap.error("--request-rate must be > 0 (inf for all at once)")
    if not (args.burstiness > 0):
        ap.error("--burstiness must be > 0")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        ap.error("--max-concurrency must be >= 1")
    if args.request_timeout <= 0 or args.max_duration <= 0:
        ap.error("--request-timeout and --max-duration must be > 0")
    if not 0.0 <= args.structured_fraction <= 1.0:
        ap.error("--structured-fraction must be in [0, 1]")
    if not isinstance(args.structured_body, dict):
        ap.error("--structured-body must be a JSON object")
    if args.extra_body is not None and not isinstance(args.extra_body, dict):
        ap.error("--extra-body must be a JSON object")
    if args.endpoint is None:
        args.endpoint = "/v1/chat/completions" if args.backend == "openai-chat" else "/v1/completions"
    if not args.endpoint.startswith("/"):
        args.endpoint = "/" + args.endpoint
    if args.backend == "openai-chat" and not args.endpoint.rstrip("/").endswith("chat/completions"):
        ap.error("--backend openai-chat needs an --endpoint ending in chat/completions")
    metrics = [m.strip() for m in args.percentile_metrics.split(",")]
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        ap.error(f"--percentile-metrics: unknown {', '.join(map(repr, bad))}; choose from {', '.join(METRICS)}")
    args.percentile_metrics = metrics
    try:
        args.metric_percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    except ValueError:
        ap.error(f"--metric-percentiles {args.metric_percentiles!r}: give comma-separated numbers, e.g. 50,90,99")
    if not all(0 <= p <= 100 for p in args.metric_percentiles):
        ap.error("--metric-percentiles: each percentile must be in [0, 100]")
    try:
        args.goodput = parse_goodput(args.goodput or [])
    except ValueError as e:
        ap.error(str(e))
    args.keep_text = args.save_detailed or args.multi_turn  # --multi-turn sends the answers back
    return args


def main():
    args = parse_args()
    use_server_tok = bool(args.tokenizer_dir) or args.server_tokenize
    if args.tokenizer_dir and not os.path.isdir(args.tokenizer_dir):
        print(f"bench_serving: note: --tokenizer-dir {args.tokenizer_dir} is not a directory here; "
              "counting tokens through the server's /tokenize anyway", file=sys.stderr)

    server = Server(args.base_url, args.api_key, min(args.request_timeout, 60.0))
    model = args.model
    if not model:
        try:
            models = server.json_call("GET", "/v1/models")
            model = models["data"][0]["id"]
        except (RuntimeError, KeyError, IndexError, TypeError) as e:
            hint = "pass --api-key" if "HTTP 401" in str(e) else "is the server up? or pass --model"
            raise SystemExit(f"bench_serving: cannot find the model at {args.base_url}/v1/models ({e}); {hint}")

    counter = TokenCounter(server, model, use_server_tok, workers=16)
    tok_note = ("token counts from the server's /tokenize" if use_server_tok
                else "token counts ESTIMATED as characters/4 (pass --tokenizer-dir for exact counts)")
    print(f"Model: {model}   server: {args.base_url}{args.endpoint} ({args.backend})")
    out_lens = None
    if args.multi_turn:
        jobs, dropped, turns_cut, n_cands = sample_conversations(args, load_conversations(args.dataset), counter)
        reqs = [rq for job in jobs for rq in job]
        print(f"Dataset: {args.dataset}: {n_cands} usable conversations; {tok_note}")
        print(f"Filter (each turn, the history estimated): prompt <= {args.max_prompt_len}, prompt + output <= "
              f"{args.max_total_len}, first prompt and answers >= 4: kept {len(jobs)} conversations of {len(reqs)} "
              f"turns ({turns_cut} later turns cut), dropped {sum(dropped.values())} ({dropped['too_short']} too "
              f"short, {dropped['prompt_too_long']} prompt too long, {dropped['total_too_long']} total too long)")
        if not jobs:
            raise SystemExit("bench_serving: no conversation passed the filter")
        if len(jobs) < args.num_prompts:
            print(f"bench_serving: warning: only {len(jobs)} of the {args.num_prompts} requested conversations "
                  "passed the filter; sending those", file=sys.stderr)
    else:
        items = load_dataset(args.dataset)
        out_lens = load_output_lens(args.output_lens_csv, args.output_lens_column) if args.output_lens_csv else None
        reqs, dropped, n_cands = sample_requests(args, items, out_lens, counter)
        jobs = [[rq] for rq in reqs]
        print(f"Dataset: {args.dataset}: {n_cands} usable prompts; {tok_note}")
        print(f"Filter: prompt <= {args.max_prompt_len}, prompt + output <= {args.max_total_len}, both >= 4: "
              f"kept {len(reqs)}, dropped {sum(dropped.values())} ({dropped['too_short']} too short, "
              f"{dropped['prompt_too_long']} prompt too long, {dropped['total_too_long']} total too long)")
        if not reqs:
            raise SystemExit("bench_serving: no prompt passed the filter")
    n_structured = 0
    for i, rq in enumerate(reqs):  # request i is structured when the running share passes a whole one
        rq["structured"] = int((i + 1) * args.structured_fraction) > int(i * args.structured_fraction)
        n_structured += rq["structured"]
    if n_structured:
        print(f"Structured output: {n_structured} of {len(reqs)} requests carry {json.dumps(args.structured_body)}")
    if not args.multi_turn and len(reqs) < args.num_prompts:
        print(f"bench_serving: warning: only {len(reqs)} of the {args.num_prompts} requested prompts "
              "passed the filter; sending those", file=sys.stderr)
    out_src = ("--output-len" if args.output_len is not None else
               "--output-lens-csv" if out_lens is not None else "the dataset")
    print(f"Output lengths from {out_src}; ignore_eos={'true' if args.ignore_eos else 'not sent'}; "
          f"{'conversation' if args.multi_turn else 'request'} rate {args.request_rate:g}/s "
          f"(burstiness {args.burstiness:g}); max concurrency {args.max_concurrency or 'unlimited'}; seed {args.seed}")
    print("TTFT is measured to the first chunk carrying a choice (as vLLM), even if its text is empty.")
    sys.stdout.flush()

    cache_before = prefix_cache_counters(server) if args.multi_turn else None
    results, duration, n_unsent, n_unfinished, interrupted, turns_sent = benchmark(server, args, model, jobs)
    run = summarize(args, results, duration, n_unsent, n_unfinished)
    mt = None
    if args.multi_turn:
        cache_after = prefix_cache_counters(server) if cache_before else None
        mt = summarize_multi_turn(args, run, jobs, turns_sent, cache_before, cache_after)
        mt["turns_cut"] = turns_cut
    print_report(args, run, interrupted, mt)
    if args.result_json:
        write_result_json(args, run, model, reqs, dropped, use_server_tok, interrupted, mt)
    return 0 if run["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
