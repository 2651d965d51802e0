/* metrics: Prometheus text exposition format 0.0.4. */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                     1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0};
static const double itl_bounds[] = {0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                                    0.15,  0.2,   0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0,   10.0};
static const double e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,    10.0,  15.0,
                                    20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0};
static const int statuses[METRICS_N_STATUS] = {200, 400, 401, 404, 405, 408, 413, 429, 500, 503, 504, 0};

void metrics_init(struct metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->hist[METRICS_TTFT] = (struct metrics_hist){.bounds = ttft_bounds, .n_bounds = sizeof ttft_bounds / sizeof(double)};
    m->hist[METRICS_ITL] = (struct metrics_hist){.bounds = itl_bounds, .n_bounds = sizeof itl_bounds / sizeof(double)};
    m->hist[METRICS_E2E] = (struct metrics_hist){.bounds = e2e_bounds, .n_bounds = sizeof e2e_bounds / sizeof(double)};
}

void metrics_free(struct metrics *m) {
    if (m) pthread_mutex_destroy(&m->mu);
}

void metrics_observe(struct metrics *m, enum metrics_hist_id id, double s) {
    if (!(s >= 0)) s = 0;
    pthread_mutex_lock(&m->mu);
    struct metrics_hist *h = &m->hist[id];
    int b = 0;
    while (b < h->n_bounds && s > h->bounds[b]) b++;
    h->counts[b]++;
    h->sum += s;
    h->count++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_status(struct metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < METRICS_N_STATUS - 1 && statuses[i] != status) i++;
    if (i < METRICS_N_STATUS - 1) m->http_status[i]++;
    else m->http_other++;
    pthread_mutex_unlock(&m->mu);
}

struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
};

static void put(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = 1;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
}

static void header(struct sbuf *b, const char *name, const char *type, const char *help) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist(struct sbuf *b, const char *name, const char *help, const struct metrics_hist *h, const char *lbl) {
    header(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        put(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, lbl, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    put(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lbl, (unsigned long long)cum);
    put(b, "%s_sum{%s} %.9g\n", name, lbl, h->sum);
    put(b, "%s_count{%s} %llu\n", name, lbl, (unsigned long long)h->count);
}

char *metrics_render(struct metrics *m, const struct engine_stats *st, const char *model_name) {
    struct sbuf b = {.cap = 8192};
    if (!(b.s = malloc(b.cap))) return NULL;
    b.s[0] = 0;
    // Label value escaping: backslash, double quote and newline.
    char lbl[600], *w = lbl;
    w += snprintf(lbl, sizeof lbl, "model_name=\"");
    for (const char *p = model_name ? model_name : ""; *p && w < lbl + sizeof lbl - 4; p++) {
        if (*p == '\\' || *p == '"') *w++ = '\\', *w++ = *p;
        else if (*p == '\n') *w++ = '\\', *w++ = 'n';
        else *w++ = *p;
    }
    *w++ = '"';
    *w = 0;

    struct engine_stats z = {0};
    if (!st) st = &z;
    header(&b, "duoserve:num_requests_running", "gauge", "Requests running on the engine (in a batch).");
    put(&b, "duoserve:num_requests_running{%s} %d\n", lbl, st->num_running);
    header(&b, "duoserve:num_requests_waiting", "gauge", "Requests waiting for the engine.");
    put(&b, "duoserve:num_requests_waiting{%s} %d\n", lbl, st->num_waiting);
    header(&b, "duoserve:kv_cache_usage_perc", "gauge", "KV cache usage per pool, fraction in [0, 1].");
    put(&b, "duoserve:kv_cache_usage_perc{%s,pool=\"full\"} %.6g\n", lbl, st->kv_usage_full);
    put(&b, "duoserve:kv_cache_usage_perc{%s,pool=\"streaming\"} %.6g\n", lbl, st->kv_usage_streaming);
    header(&b, "duoserve:prompt_tokens_total", "counter", "Prompt tokens processed.");
    put(&b, "duoserve:prompt_tokens_total{%s} %llu\n", lbl, (unsigned long long)st->prompt_tokens_total);
    header(&b, "duoserve:generation_tokens_total", "counter", "Tokens generated.");
    put(&b, "duoserve:generation_tokens_total{%s} %llu\n", lbl, (unsigned long long)st->generation_tokens_total);
    header(&b, "duoserve:num_preemptions_total", "counter", "Requests preempted for lack of KV cache.");
    put(&b, "duoserve:num_preemptions_total{%s} %llu\n", lbl, (unsigned long long)st->preemptions_total);
    header(&b, "duoserve:request_success_total", "counter", "Finished sequences by finish reason.");
    put(&b, "duoserve:request_success_total{%s,finished_reason=\"stop\"} %llu\n", lbl, (unsigned long long)st->finished_stop);
    put(&b, "duoserve:request_success_total{%s,finished_reason=\"length\"} %llu\n", lbl, (unsigned long long)st->finished_length);
    put(&b, "duoserve:request_success_total{%s,finished_reason=\"abort\"} %llu\n", lbl, (unsigned long long)st->finished_abort);
    header(&b, "duoserve:kv_cache_capacity_tokens", "gauge", "Tokens the full KV pool holds.");
    put(&b, "duoserve:kv_cache_capacity_tokens{%s} %d\n", lbl, st->kv_capacity_tokens);

    pthread_mutex_lock(&m->mu);
    hist(&b, "duoserve:time_to_first_token_seconds", "Time from request arrival to its first token.", &m->hist[METRICS_TTFT], lbl);
    hist(&b, "duoserve:inter_token_latency_seconds", "Time between consecutive tokens of one choice, as the server sees them.",
         &m->hist[METRICS_ITL], lbl);
    hist(&b, "duoserve:e2e_request_latency_seconds", "Time from request arrival to its last token.", &m->hist[METRICS_E2E], lbl);
    header(&b, "duoserve:http_requests_total", "counter", "HTTP responses by status code.");
    for (int i = 0; i < METRICS_N_STATUS - 1; i++)
        if (m->http_status[i])
            put(&b, "duoserve:http_requests_total{%s,status=\"%d\"} %llu\n", lbl, statuses[i], (unsigned long long)m->http_status[i]);
    if (m->http_other) put(&b, "duoserve:http_requests_total{%s,status=\"other\"} %llu\n", lbl, (unsigned long long)m->http_other);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
