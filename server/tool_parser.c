/* Tool calls in a model's text (server/tool_parser.h). A left-to-right scanner in two modes:
 * TEXT (content, watching for a call's start) and GROUP (a marker or a bare '{' / '[' and the
 * call objects after it). Each feed appends the new text and scans again from where the last
 * decision was made; a call object is re-scanned from its '{' (objects are small), and every
 * decision depends only on the text before it, so any cutting of the text gives the same deltas. */
#include "server/tool_parser.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE ((size_t)-1)

enum mode { M_TEXT, M_GROUP };
enum kind { K_HERMES, K_MISTRAL, K_LIST, K_SEMI }; // how the group's calls follow each other
enum step { S_OPEN, S_NEXT, S_OBJECT, S_AFTER };

static const struct marker {
    const char *s;
    size_t n;
    enum kind kind;
} markers[] = {
    {"<tool_call>", 11, K_HERMES},
    {"[TOOL_CALLS]", 12, K_MISTRAL},
    {"<|python_tag|>", 14, K_SEMI},
};
#define N_MARKERS (sizeof markers / sizeof *markers)

struct tool_parser {
    bool parallel, short_ids;
    uint64_t rng;
    char **names; // calls must name one of these (none: any name)
    int n_names;
    char *buf;
    size_t len, cap;
    enum mode mode;
    size_t pos;          // TEXT: the text before pos is decided
    size_t skip_until;   // a group cannot start before this (a failed group's opener)
    bool content_nonws;  // content other than whitespace was sent
    bool after_call;     // TEXT right after a group with calls: leading whitespace is not content
    /* GROUP */
    enum kind kind;
    enum step step;
    size_t gstart, gopen; // the group's text (held whitespace, opener) and its opener
    size_t gp;            // where parsing resumes
    size_t obj;           // S_OBJECT: the object's '{'
    bool confirmed;       // the current object's call was sent
    size_t args_at, args_sent;
    int group_calls, n_calls;
    char id[32];
};

/* ---- small helpers ---- */

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const struct tool_parser *p, size_t i) {
    while (i < p->len && is_ws(p->buf[i])) i++;
    return i;
}

/* The end of the JSON string starting at i ('"'): one past its closing quote, or NONE when the
 * text ends first. */
static size_t string_end(const char *b, size_t i, size_t n) {
    for (i++; i < n; i++) {
        if (b[i] == '\\') i++;
        else if (b[i] == '"') return i + 1;
    }
    return NONE;
}

/* The end of the JSON value at i: brackets matched and strings skipped, tokens between not
 * checked (cJSON checks what needs it). Returns the end, or NONE when the text ends first; a
 * bracket that closes the wrong one gives NONE with *bad at it. */
static size_t value_end(const char *b, size_t i, size_t n, size_t *bad) {
    char stack[256];
    int depth = 0;
    *bad = NONE;
    if (i >= n) return NONE;
    if (b[i] == '"') return string_end(b, i, n);
    if (b[i] != '{' && b[i] != '[') { /* a number or literal: ends at a delimiter */
        while (i < n && !is_ws(b[i]) && !strchr(",:]}", b[i])) i++;
        return i < n ? i : NONE;
    }
    for (; i < n; i++) {
        char c = b[i];
        if (c == '"') {
            size_t e = string_end(b, i, n);
            if (e == NONE) return NONE;
            i = e - 1;
        } else if (c == '{' || c == '[') {
            if (depth == (int)sizeof stack) return *bad = i, NONE;
            stack[depth++] = c == '{' ? '}' : ']';
        } else if (c == '}' || c == ']') {
            if (!depth || stack[depth - 1] != c) return *bad = i, NONE;
            if (--depth == 0) return i + 1;
        }
    }
    return NONE;
}

static bool starts(const struct tool_parser *p, size_t i, const char *s, size_t n) {
    return i + n <= p->len && !memcmp(p->buf + i, s, n);
}

static bool name_allowed(const struct tool_parser *p, const char *name, size_t n) {
    if (!p->n_names) return n > 0;
    for (int i = 0; i < p->n_names; i++)
        if (strlen(p->names[i]) == n && !memcmp(p->names[i], name, n)) return true;
    return false;
}

static uint64_t next_rand(struct tool_parser *p) {
    uint64_t z = (p->rng += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void make_id(struct tool_parser *p) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t o = 0;
    int n = p->short_ids ? 9 : 24;
    if (!p->short_ids) o = (size_t)snprintf(p->id, sizeof p->id, "call_");
    for (int i = 0; i < n; i++) p->id[o++] = abc[next_rand(p) % 62];
    p->id[o] = 0;
}

/* ---- deltas ---- */

struct emit {
    tool_delta_fn out;
    void *ud;
};

static int send(struct tool_parser *p, const struct emit *e, enum tool_delta_kind kind, const char *t, size_t n) {
    if (kind != TOOL_DELTA_CONTENT && !p->parallel && p->n_calls > 0) return 0; /* only the first call */
    if (kind == TOOL_DELTA_ARGS && !n) return 0;
    if (kind == TOOL_DELTA_CALL) make_id(p);
    struct tool_delta d = {.kind = kind, .index = p->n_calls, .id = kind == TOOL_DELTA_CALL ? p->id : NULL,
                           .text = t, .len = n};
    return e->out(e->ud, &d);
}

static int send_content(struct tool_parser *p, const struct emit *e, size_t from, size_t to) {
    for (size_t i = from; i < to && !p->content_nonws; i++) p->content_nonws = !is_ws(p->buf[i]);
    return send(p, e, TOOL_DELTA_CONTENT, p->buf + from, to - from);
}

/* ---- TEXT ---- */

/* Length of the longest suffix of buf[from, len) that is a proper prefix of a marker. */
static size_t marker_holdback(const struct tool_parser *p, size_t from) {
    size_t best = 0;
    for (size_t m = 0; m < N_MARKERS; m++)
        for (size_t k = markers[m].n - 1; k > best; k--)
            if (p->len >= from + k && !memcmp(p->buf + p->len - k, markers[m].s, k)) {
                best = k;
                break;
            }
    return best;
}

static void start_group(struct tool_parser *p, size_t at, int marker) {
    p->mode = M_GROUP;
    p->gstart = p->pos;
    p->gopen = at;
    p->group_calls = 0;
    p->confirmed = false;
    if (marker >= 0) {
        p->kind = markers[marker].kind;
        p->gp = at + markers[marker].n;
        p->step = S_OPEN;
    } else if (p->buf[at] == '[') {
        p->kind = K_LIST;
        p->gp = at + 1;
        p->step = S_NEXT;
    } else {
        p->kind = K_SEMI;
        p->gp = at;
        p->step = S_OPEN;
    }
}

/* Returns 1 after a change of mode, 0 when it needs more text, -1 on error. */
static int step_text(struct tool_parser *p, bool final, const struct emit *e) {
    if (p->after_call) {
        size_t i = skip_ws(p, p->pos);
        p->pos = i;
        if (i == p->len) return 0;
        p->after_call = false;
    }
    /* the next call's start: a marker, or (before any content) a bare '{' or '[' */
    size_t m = NONE, from = p->pos > p->skip_until ? p->pos : p->skip_until;
    int which = -1;
    for (size_t k = 0; k < N_MARKERS; k++) {
        const char *hit = p->len > from ? memmem(p->buf + from, p->len - from, markers[k].s, markers[k].n) : NULL;
        if (hit && (size_t)(hit - p->buf) < m) m = (size_t)(hit - p->buf), which = (int)k;
    }
    if (!p->content_nonws) {
        size_t i = skip_ws(p, p->pos);
        if (!final && i < p->len && i < m && marker_holdback(p, i) == p->len - i) return 0; /* "[" of "[TOOL_CALLS]"? */
        if (i < p->len && i < m && i >= p->skip_until && (p->buf[i] == '{' || p->buf[i] == '['))
            m = i, which = -1;
    }
    /* content up to it, or up to what may still become a marker; trailing whitespace waits */
    size_t cut = m != NONE ? m : final ? p->len : p->len - marker_holdback(p, p->pos);
    size_t t = cut;
    while (t > p->pos && is_ws(p->buf[t - 1])) t--;
    if (m == NONE && final && p->n_calls == 0) t = cut; /* no calls: the text is all content */
    if (t > p->pos) {
        if (send_content(p, e, p->pos, t)) return -1;
        p->pos = t;
    }
    if (m != NONE) {
        start_group(p, m, which);
        return 1;
    }
    if (final) p->pos = p->len;
    return 0;
}

/* ---- GROUP ---- */

static int end_group(struct tool_parser *p, size_t at) {
    p->mode = M_TEXT;
    p->pos = at;
    p->after_call = p->group_calls > 0;
    return 1;
}

/* What is not a call from `at` on is content: the whole group when it has no call yet. */
static int fail_group(struct tool_parser *p, size_t at) {
    p->mode = M_TEXT;
    p->after_call = false;
    p->pos = p->group_calls ? at : p->gstart;
    p->skip_until = (p->group_calls ? at : p->gopen) + 1;
    return 1;
}

static void done_call(struct tool_parser *p, size_t end) {
    p->n_calls++;
    p->group_calls++;
    p->confirmed = false;
    p->gp = end;
    p->step = S_AFTER;
}

/* The canonical start of a call object at p->obj: { "name": "<name>", "arguments"|"parameters": {
 * Returns 1 (then name_at, name_end and args_at are set), 0 when the text ends first, -1 when
 * the object starts otherwise. */
static int canonical(const struct tool_parser *p, size_t *name_at, size_t *name_end, size_t *args_at) {
    const char *b = p->buf;
    size_t n = p->len, i = skip_ws(p, p->obj + 1);
    if (i >= n) return 0;
    if (!starts(p, i, "\"name\"", 6)) return n - i < 6 && !memcmp(b + i, "\"name\"", n - i) ? 0 : -1;
    i = skip_ws(p, i + 6);
    if (i >= n) return 0;
    if (b[i] != ':') return -1;
    i = skip_ws(p, i + 1);
    if (i >= n) return 0;
    if (b[i] != '"') return -1;
    size_t e = string_end(b, i, n);
    if (e == NONE) return 0;
    *name_at = i;
    *name_end = e;
    i = skip_ws(p, e);
    if (i >= n) return 0;
    if (b[i] != ',') return -1;
    i = skip_ws(p, i + 1);
    if (i >= n) return 0;
    size_t kl = starts(p, i, "\"arguments\"", 11) ? 11 : starts(p, i, "\"parameters\"", 12) ? 12 : 0;
    if (!kl) {
        bool maybe = (n - i < 11 && !memcmp(b + i, "\"arguments\"", n - i)) ||
                     (n - i < 12 && !memcmp(b + i, "\"parameters\"", n - i));
        return maybe ? 0 : -1;
    }
    i = skip_ws(p, i + kl);
    if (i >= n) return 0;
    if (b[i] != ':') return -1;
    i = skip_ws(p, i + 1);
    if (i >= n) return 0;
    if (b[i] != '{') return -1;
    *args_at = i;
    return 1;
}

/* A complete object that did not start canonically: a call when it has a known "name" and
 * "arguments" or "parameters" (an object, or a string holding the JSON; absent: {}). Sends it
 * whole. Returns 1 (a call), 0 (not one), -1 (error). */
static int whole_call(struct tool_parser *p, const struct emit *e, size_t end) {
    cJSON *o = cJSON_ParseWithLength(p->buf + p->obj, end - p->obj);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    int rc = 0;
    if (cJSON_IsObject(o) && cJSON_IsString(name) && name_allowed(p, name->valuestring, strlen(name->valuestring)) &&
        (!args || cJSON_IsObject(args) || cJSON_IsString(args))) {
        char *text = !args ? strdup("{}") : cJSON_IsString(args) ? strdup(args->valuestring) : cJSON_PrintUnformatted(args);
        rc = !text || send(p, e, TOOL_DELTA_CALL, name->valuestring, strlen(name->valuestring)) ||
                     send(p, e, TOOL_DELTA_ARGS, text, strlen(text))
                 ? -1
                 : 1;
        free(text);
    }
    cJSON_Delete(o);
    return rc;
}

static int step_object(struct tool_parser *p, bool final, const struct emit *e) {
    size_t name_at = 0, name_end = 0, args_at = 0, bad;
    if (!p->confirmed && canonical(p, &name_at, &name_end, &args_at) == 1) {
        cJSON *nm = cJSON_ParseWithLength(p->buf + name_at, name_end - name_at);
        bool ok = cJSON_IsString(nm) && name_allowed(p, nm->valuestring, strlen(nm->valuestring));
        int rc = ok ? send(p, e, TOOL_DELTA_CALL, nm->valuestring, strlen(nm->valuestring)) : 0;
        cJSON_Delete(nm);
        if (rc) return -1;
        if (ok) p->confirmed = true, p->args_at = args_at, p->args_sent = 0;
    }
    size_t end = value_end(p->buf, p->obj, p->len, &bad);
    if (p->confirmed) { /* the arguments as written, up to their end or the text's */
        size_t abad, aend = value_end(p->buf, p->args_at, p->len, &abad);
        size_t upto = aend != NONE ? aend : abad != NONE ? abad : p->len;
        if (send(p, e, TOOL_DELTA_ARGS, p->buf + p->args_at + p->args_sent, upto - p->args_at - p->args_sent)) return -1;
        p->args_sent = upto - p->args_at;
        if (end != NONE) return done_call(p, end), 1;
        if (bad != NONE) return done_call(p, bad), end_group(p, bad);
        if (final) return done_call(p, p->len), end_group(p, p->len);
        return 0;
    }
    if (end == NONE) return bad != NONE || final ? fail_group(p, p->obj) : 0;
    int rc = whole_call(p, e, end);
    if (rc < 0) return -1;
    if (rc == 0) return fail_group(p, p->obj);
    done_call(p, end);
    return 1;
}

/* Returns 1 after progress, 0 when it needs more text, -1 on error. */
static int step_group(struct tool_parser *p, bool final, const struct emit *e) {
    size_t j = skip_ws(p, p->gp);
    if (p->step == S_OBJECT) return step_object(p, final, e);
    if (j >= p->len) {
        if (!final) return 0;
        return p->step == S_AFTER ? end_group(p, p->gp) : fail_group(p, j);
    }
    char c = p->buf[j];
    switch (p->step) {
    case S_OPEN:
    case S_NEXT:
        if (c == '{') {
            p->obj = j;
            p->step = S_OBJECT;
            return 1;
        }
        if (c == '[' && p->kind == K_MISTRAL && p->step == S_OPEN) {
            p->kind = K_LIST;
            p->gp = j + 1;
            p->step = S_NEXT;
            return 1;
        }
        return fail_group(p, j);
    case S_AFTER:
        if (p->kind == K_HERMES) {
            static const char close[] = "</tool_call>";
            size_t avail = p->len - j < 12 ? p->len - j : 12;
            if (!memcmp(p->buf + j, close, avail)) {
                if (avail == 12) return end_group(p, j + 12);
                return final ? end_group(p, p->gp) : 0;
            }
            return end_group(p, p->gp);
        }
        if (c == ',' || (c == ';' && p->kind != K_LIST)) {
            p->gp = j + 1;
            p->step = p->kind == K_LIST ? S_NEXT : S_OPEN;
            return 1;
        }
        if (c == ']' && p->kind == K_LIST) return end_group(p, j + 1);
        return end_group(p, p->gp);
    default: return -1;
    }
}

/* ---- API ---- */

struct tool_parser *tool_parser_new(bool parallel, bool short_ids, uint64_t seed) {
    struct tool_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->parallel = parallel;
    p->short_ids = short_ids;
    p->rng = seed;
    return p;
}

int tool_parser_allow_name(struct tool_parser *p, const char *name) {
    char **nv = realloc(p->names, sizeof *nv * (size_t)(p->n_names + 1));
    if (!nv) return -1;
    p->names = nv;
    if (!(nv[p->n_names] = strdup(name))) return -1;
    p->n_names++;
    return 0;
}

void tool_parser_free(struct tool_parser *p) {
    if (!p) return;
    for (int i = 0; i < p->n_names; i++) free(p->names[i]);
    free(p->names);
    free(p->buf);
    free(p);
}

int tool_parser_feed(struct tool_parser *p, const char *text, size_t len, bool final, tool_delta_fn out, void *ud) {
    if (p->len + len + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 256;
        while (cap < p->len + len + 1) cap *= 2;
        char *b = realloc(p->buf, cap);
        if (!b) return -1;
        p->buf = b;
        p->cap = cap;
    }
    if (len) memcpy(p->buf + p->len, text, len);
    p->len += len;
    p->buf[p->len] = 0;
    struct emit e = {out, ud};
    for (int guard = 0;; guard++) {
        int rc = p->mode == M_TEXT ? step_text(p, final, &e) : step_group(p, final, &e);
        if (rc < 0) return -1;
        if (rc == 0) return 0;
        if (guard > 1 << 24) return -1; /* not reached: every step moves forward */
    }
}

int tool_parser_calls(const struct tool_parser *p) { return p->parallel || p->n_calls < 1 ? p->n_calls : 1; }
