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
import json
import math
import os
import queue
import random
import sys
import threading
import time

sys.dont_write_bytecode = True  # importing the bench_* modules leaves no scripts/__pycache__ behind
from bench_client import Result, STRUCTURED_BODY, Server, run_request  # noqa: E402
from bench_data import (TokenCounter, load_conversations, load_dataset, load_output_lens,  # noqa: E402
                        sample_conversations, sample_requests)
from bench_report import (METRICS, parse_goodput, prefix_cache_counters, print_report, summarize,  # noqa: E402
                          summarize_multi_turn, write_result_json)


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


def make_parser():
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
    return ap


def check_multi_turn(ap, args):
    """--multi-turn's flags, and the ones it does not take."""
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


def parse_args():
    ap = make_parser()
    args = ap.parse_args()
    if args.num_prompts < 1:
        ap.error("--num-prompts must be >= 1")
    check_multi_turn(ap, args)
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
