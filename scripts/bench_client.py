"""bench_client: the HTTP side of scripts/bench_serving.py: a keep-alive JSON client of the server
(Server), OpenAI-shaped error messages, and one streamed request timed chunk by chunk
(run_request -> Result). Python standard library only."""
import http.client
import json
import socket
import time
import urllib.parse


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


def request_body(args, model, req, messages):
    """The JSON body of one streamed request."""
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
    return json.dumps(body).encode()


def take_usage(res, usage):
    """A stream's usage object into res (the counts the server reports)."""
    if isinstance(usage.get("completion_tokens"), int):
        res.output_tokens = usage["completion_tokens"]
        res.usage_seen = True
    if isinstance(usage.get("prompt_tokens"), int):
        res.prompt_tokens = usage["prompt_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        res.cached_tokens = details["cached_tokens"]


def run_request(server, args, model, req, run_deadline, stop, messages=None):
    """One streamed request; chat requests send `messages` (--multi-turn: the conversation so
    far), else the prompt as one user message."""
    res = Result(req)
    chat = args.backend == "openai-chat"
    payload = request_body(args, model, req, messages)

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
            if isinstance(obj.get("usage"), dict):
                take_usage(res, obj["usage"])
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
