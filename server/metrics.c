/* metrics: Prometheus text exposition format 0.0.4. Every family gets HELP and TYPE lines and
 * its samples in one group; histograms list cumulative buckets ending in +Inf, then _sum and
 * _count. */
#include "server/metrics.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                     1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = ENGINE_TOKEN_TIME_BOUNDS;
static const double e2e_bounds[] = ENGINE_LATENCY_BOUNDS;
static const int statuses[METRICS_N_STATUS] = {200, 400, 401, 404, 405, 408, 413, 429, 500, 503, 504, 0};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

void metrics_init(struct metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    engine_hist_init(&m->hist[METRICS_TTFT], ttft_bounds, N_OF(ttft_bounds));
    engine_hist_init(&m->hist[METRICS_ITL], itl_bounds, N_OF(itl_bounds));
    engine_hist_init(&m->hist[METRICS_E2E], e2e_bounds, N_OF(e2e_bounds));
}

void metrics_free(struct metrics *m) {
    if (m) pthread_mutex_destroy(&m->mu);
}

void metrics_observe(struct metrics *m, enum metrics_hist_id id, double s) {
    pthread_mutex_lock(&m->mu);
    engine_hist_observe(&m->hist[id], s);
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

/* ---- text output ---- */

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

/* One histogram family; h NULL: declared without samples (the engine is not loaded yet). */
static void hist(struct sbuf *b, const char *name, const char *help, const struct engine_hist *h, const char *lbl) {
    header(b, name, "histogram", help);
    if (!h) return;
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        put(b, "%s_bucket{%s,le=\"%.15g\"} %llu\n", name, lbl, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    put(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lbl, (unsigned long long)cum);
    put(b, "%s_sum{%s} %.17g\n", name, lbl, h->sum);
    put(b, "%s_count{%s} %llu\n", name, lbl, (unsigned long long)h->count);
}

static void counter(struct sbuf *b, const char *name, const char *help, const char *lbl, uint64_t v) {
    header(b, name, "counter", help);
    put(b, "%s{%s} %llu\n", name, lbl, (unsigned long long)v);
}

static void render_engine_counts(struct sbuf *b, const struct engine_stats *st, const char *lbl) {
    header(b, "duoserve:num_requests_running", "gauge", "Requests running on the engine (in a batch).");
    put(b, "duoserve:num_requests_running{%s} %d\n", lbl, st->num_running);
    header(b, "duoserve:num_requests_waiting", "gauge", "Requests waiting for the engine.");
    put(b, "duoserve:num_requests_waiting{%s} %d\n", lbl, st->num_waiting);
    header(b, "duoserve:kv_cache_usage_perc", "gauge", "KV cache usage per pool, fraction in [0, 1].");
    put(b, "duoserve:kv_cache_usage_perc{%s,pool=\"full\"} %.6g\n", lbl, st->kv_usage_full);
    put(b, "duoserve:kv_cache_usage_perc{%s,pool=\"streaming\"} %.6g\n", lbl, st->kv_usage_streaming);
    counter(b, "duoserve:prompt_tokens_total", "Prompt tokens processed.", lbl, st->prompt_tokens_total);
    counter(b, "duoserve:generation_tokens_total", "Tokens generated.", lbl, st->generation_tokens_total);
    counter(b, "duoserve:num_preemptions_total", "Requests preempted for lack of KV cache.", lbl, st->preemptions_total);
    header(b, "duoserve:request_success_total", "counter", "Finished sequences by finish reason.");
    put(b, "duoserve:request_success_total{%s,finished_reason=\"stop\"} %llu\n", lbl, (unsigned long long)st->finished_stop);
    put(b, "duoserve:request_success_total{%s,finished_reason=\"length\"} %llu\n", lbl,
        (unsigned long long)st->finished_length);
    put(b, "duoserve:request_success_total{%s,finished_reason=\"abort\"} %llu\n", lbl, (unsigned long long)st->finished_abort);
    counter(b, "duoserve:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", lbl,
            st->prefix_cache_queries);
    counter(b, "duoserve:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", lbl, st->prefix_cache_hits);
    header(b, "duoserve:prefix_cache_blocks", "gauge", "Full-pool blocks the prefix cache addresses (in use or idle).");
    put(b, "duoserve:prefix_cache_blocks{%s} %d\n", lbl, st->prefix_cache_blocks);
    header(b, "duoserve:kv_cache_capacity_tokens", "gauge", "Tokens the full KV pool holds.");
    put(b, "duoserve:kv_cache_capacity_tokens{%s} %d\n", lbl, st->kv_capacity_tokens);
}

/* vLLM's cache_config_info: a gauge fixed at 1 whose labels carry the KV cache configuration. */
static void render_cache_info(struct sbuf *b, const struct engine_stats *st, const char *lbl) {
    header(b, "duoserve:cache_config_info", "gauge", "Information of the KV cache configuration (labels; value 1).");
    if (!st) return;
    const struct engine_cache_info *c = &st->cache;
    put(b,
        "duoserve:cache_config_info{%s,block_size=\"%d\",cache_dtype=\"%s\",enable_prefix_caching=\"%s\","
        "gpu_memory_utilization=\"%g\",num_gpu_blocks=\"%d\",num_streaming_slots=\"%d\",sink_tokens=\"%d\","
        "recent_tokens=\"%d\"} 1\n",
        lbl, c->block_size, c->cache_dtype ? c->cache_dtype : "",
        c->enable_prefix_caching ? "True" : "False", (double)c->gpu_memory_utilization,
        c->num_gpu_blocks, c->num_streaming_slots, c->sink_tokens, c->recent_tokens);
}

static void render_engine_hists(struct sbuf *b, const struct engine_stats *st, const char *lbl) {
    static const struct {
        enum engine_hist_id id;
        const char *name, *help;
    } hs[] = {
        {ENGINE_HIST_QUEUE, "duoserve:request_queue_time_seconds",
         "Histogram of time spent in WAITING phase for request (arrival to first scheduled)."},
        {ENGINE_HIST_PREFILL, "duoserve:request_prefill_time_seconds",
         "Histogram of time spent in PREFILL phase for request (first scheduled to first token)."},
        {ENGINE_HIST_DECODE, "duoserve:request_decode_time_seconds",
         "Histogram of time spent in DECODE phase for request (first to last token)."},
        {ENGINE_HIST_INFERENCE, "duoserve:request_inference_time_seconds",
         "Histogram of time spent in RUNNING phase for request (first scheduled to last token)."},
        {ENGINE_HIST_TPOT, "duoserve:time_per_output_token_seconds",
         "Histogram of time per output token in seconds (each token after a sequence's first)."},
        {ENGINE_HIST_REQUEST_TPOT, "duoserve:request_time_per_output_token_seconds",
         "Histogram of the mean time per output token of each finished sequence."},
        {ENGINE_HIST_PROMPT_TOKENS, "duoserve:request_prompt_tokens", "Number of prefill tokens processed."},
        {ENGINE_HIST_GENERATION_TOKENS, "duoserve:request_generation_tokens", "Number of generation tokens processed."},
        {ENGINE_HIST_ITERATION_TOKENS, "duoserve:iteration_tokens_total",
         "Histogram of number of tokens per engine_step (prompt and decode tokens computed)."},
    };
    for (int i = 0; i < N_OF(hs); i++) hist(b, hs[i].name, hs[i].help, st ? &st->hist[hs[i].id] : NULL, lbl);
}

/* ---- process_* (as the Prometheus client libraries export them), from /proc ---- */

struct proc_stats {
    double cpu_s, start_s;
    unsigned long long vsize, rss;
    long long open_fds, max_fds; // -1: unknown
};

static int read_small_file(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = 0;
    return got ? 0 : -1;
}

static int proc_read(struct proc_stats *p) {
    char buf[4096];
    if (read_small_file("/proc/self/stat", buf, sizeof buf)) return -1;
    /* fields after the command name, which may hold spaces and parentheses: state is field 3 */
    const char *rp = strrchr(buf, ')');
    unsigned long utime, stime, rss_pages;
    unsigned long long starttime, vsize;
    if (!rp || sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %*d %*d %llu %llu %lu",
                      &utime, &stime, &starttime, &vsize, &rss_pages) != 5)
        return -1;
    long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    if (tck <= 0 || page <= 0) return -1;
    p->cpu_s = (double)(utime + stime) / tck;
    p->vsize = vsize;
    p->rss = (unsigned long long)rss_pages * (unsigned long long)page;
    /* start time: boot time (btime of /proc/stat) + starttime ticks after boot */
    p->start_s = -1;
    FILE *f = fopen("/proc/stat", "r");
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0) /* its interrupt line alone may take kilobytes */
        if (!strncmp(line, "btime ", 6)) {
            p->start_s = strtod(line + 6, NULL) + (double)starttime / tck;
            break;
        }
    free(line);
    if (f) fclose(f);
    p->open_fds = -1;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        p->open_fds = 0;
        for (struct dirent *de; (de = readdir(d));)
            if (de->d_name[0] != '.') p->open_fds++;
        closedir(d);
    }
    struct rlimit rl;
    p->max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long long)rl.rlim_cur : -1;
    return 0;
}

static void render_process(struct sbuf *b) {
    struct proc_stats p;
    if (proc_read(&p)) return; /* not Linux: no process_* series at all */
    header(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
    put(b, "process_virtual_memory_bytes %llu\n", p.vsize);
    header(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    put(b, "process_resident_memory_bytes %llu\n", p.rss);
    if (p.start_s >= 0) {
        header(b, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.");
        put(b, "process_start_time_seconds %.2f\n", p.start_s);
    }
    header(b, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
    put(b, "process_cpu_seconds_total %.9g\n", p.cpu_s);
    if (p.open_fds >= 0) {
        header(b, "process_open_fds", "gauge", "Number of open file descriptors.");
        put(b, "process_open_fds %lld\n", p.open_fds);
    }
    if (p.max_fds >= 0) {
        header(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        put(b, "process_max_fds %lld\n", p.max_fds);
    }
}

/* ---- the whole page ---- */

char *metrics_render(struct metrics *m, const struct engine_stats *st, const char *model_name) {
    struct sbuf b = {.cap = 32768};
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
    render_engine_counts(&b, st ? st : &z, lbl);
    render_cache_info(&b, st, lbl);
    render_engine_hists(&b, st, lbl);

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
    render_process(&b);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
