"""bench_data: the workload of scripts/bench_serving.py: ShareGPT-format datasets and output
length tables, token counting (the server's /tokenize or a local approximation), the sampled
requests and, for --multi-turn, the conversations. Python standard library only."""
import csv
import json
import math
import queue
import random
import threading


HUMAN_ROLES = ("human", "user")
GPT_ROLES = ("gpt", "assistant", "chatgpt", "bard", "model")




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
