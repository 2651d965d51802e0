/* engine: the engine thread (a libuv loop around engine_core) and the thread-safe API of
 * engine.h. Submissions and cancels reach the loop through one uv_async_t; while there is
 * work, a uv_idle_t runs one core step per loop iteration. Events go into per-request queues
 * under the engine mutex, then the request's notify callback wakes its consumer. */
#include "engine/engine.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "engine/elog.h"
#include "engine/engine_core.h"
#include "engine/grammar_cache.h"
#include "engine/util.h"
#include "engine/warmup.h"

struct engine_handle {
    struct engine *e;
    struct engine_request *req; // the request's one copy, until the core takes it (admission)
    int n_choices;
    void (*notify)(void *ud);
    void *ud;
    pthread_mutex_t notify_mu; // held while notify runs; release takes it, so no notify follows release
    struct core_request *cr;   // engine thread only; NULL before admission and after the end
    struct grammar_cache_entry *ge; // structured output: the grammar compiled at submit, held until the
                                    // core holds it too (so the engine thread never compiles)
    struct engine_event *q;    // event ring
    int q_head, q_len, q_cap;
    int n_finished;
    bool cancel, released, done, added;
    int refs;                  // caller + engine
    struct engine_handle *next; // inbox / live list
};

struct engine {
    struct core *core;
    uv_loop_t loop;
    uv_async_t wake;
    uv_idle_t idle;
    uv_thread_t thread;
    pthread_mutex_t mu;
    struct engine_handle *inbox; // submitted, not yet seen by the loop (mu)
    struct engine_handle *live;  // added to the core (engine thread only)
    bool draining, stopping;     // mu
    bool failed;                 // mu: the core returned ENGINE_ERR_FATAL
    int n_active;                // submitted and not done (mu)
    /* The queue limit's view (mu): requests, in the core or the inbox, that no free seat can
     * take, and the seats left after those that fit. Recomputed after each step, updated by
     * each submission between steps. */
    int q_unseated, q_seats_left;
    struct engine_stats stats;   // the core's counters after each step, the cache info, the histograms (mu)
};

static const double latency_bounds[] = ENGINE_LATENCY_BOUNDS;
static const double tpot_bounds[] = ENGINE_TOKEN_TIME_BOUNDS;
/* vLLM's iteration_tokens_total bounds (it uses its CUDA-graph batch sizes when it has them) */
static const double iteration_bounds[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

/* vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max. Returns the count. */
static int bounds_1_2_5(double *out, int cap, int max) {
    int n = 0;
    for (double p = 1; n < cap; p *= 10)
        for (int k = 0; k < 3 && n < cap; k++) {
            double v = p * (k == 0 ? 1 : k == 1 ? 2 : 5);
            if (v > max) return n;
            out[n++] = v;
        }
    return n;
}

static void hists_init(struct engine *e) {
    struct engine_hist *h = e->stats.hist;
    int nl = (int)(sizeof latency_bounds / sizeof(double)), nt = (int)(sizeof tpot_bounds / sizeof(double));
    engine_hist_init(&h[ENGINE_HIST_QUEUE], latency_bounds, nl);
    engine_hist_init(&h[ENGINE_HIST_PREFILL], latency_bounds, nl);
    engine_hist_init(&h[ENGINE_HIST_DECODE], latency_bounds, nl);
    engine_hist_init(&h[ENGINE_HIST_INFERENCE], latency_bounds, nl);
    engine_hist_init(&h[ENGINE_HIST_TPOT], tpot_bounds, nt);
    engine_hist_init(&h[ENGINE_HIST_REQUEST_TPOT], tpot_bounds, nt);
    engine_hist_init(&h[ENGINE_HIST_ITERATION_TOKENS], iteration_bounds, sizeof iteration_bounds / sizeof(double));
    double tok[ENGINE_HIST_MAX_BOUNDS];
    int n = bounds_1_2_5(tok, ENGINE_HIST_MAX_BOUNDS, core_max_model_len(e->core));
    engine_hist_init(&h[ENGINE_HIST_PROMPT_TOKENS], tok, n);
    engine_hist_init(&h[ENGINE_HIST_GENERATION_TOKENS], tok, n);
}

/* Under e->mu: the stats of one event the core emitted. */
static void hists_observe_event(struct engine *e, const struct engine_event *ev) {
    struct engine_hist *h = e->stats.hist;
    if (ev->type == ENGINE_EVENT_TOKEN && ev->itl_s >= 0) engine_hist_observe(&h[ENGINE_HIST_TPOT], ev->itl_s);
    if (ev->type != ENGINE_EVENT_FINISH) return;
    engine_hist_observe(&h[ENGINE_HIST_QUEUE], ev->queue_s);
    engine_hist_observe(&h[ENGINE_HIST_PREFILL], ev->prefill_s);
    engine_hist_observe(&h[ENGINE_HIST_DECODE], ev->decode_s);
    engine_hist_observe(&h[ENGINE_HIST_INFERENCE], ev->prefill_s + ev->decode_s);
    if (ev->completion_tokens > 1)
        engine_hist_observe(&h[ENGINE_HIST_REQUEST_TPOT], ev->decode_s / (ev->completion_tokens - 1));
    engine_hist_observe(&h[ENGINE_HIST_PROMPT_TOKENS], ev->prompt_tokens);
    engine_hist_observe(&h[ENGINE_HIST_GENERATION_TOKENS], ev->completion_tokens);
}

static void handle_unref_locked(struct engine_handle *h) {
    if (--h->refs > 0) return;
    pthread_mutex_destroy(&h->notify_mu);
    for (int i = 0; i < h->q_len; i++) free(h->q[(h->q_head + i) % h->q_cap].text);
    free(h->q);
    engine_request_free(h->req);
    free(h);
}

/* Engine thread: an event of h's request (ownership of ev->text moves to the queue); from the
 * core (core_event) or made here for a request the core refused (no stats then). */
static void on_event_stats(void *ud, const struct engine_event *ev, bool stats) {
    struct engine_handle *h = ud;
    struct engine *e = h->e;
    pthread_mutex_lock(&e->mu);
    if (stats) hists_observe_event(e, ev);
    if (h->q_len == h->q_cap) {
        int nc = h->q_cap ? h->q_cap * 2 : 16;
        struct engine_event *nq = malloc(sizeof *nq * nc);
        if (nq) {
            for (int i = 0; i < h->q_len; i++) nq[i] = h->q[(h->q_head + i) % h->q_cap];
            free(h->q);
            h->q = nq;
            h->q_head = 0;
            h->q_cap = nc;
        }
    }
    if (h->q_len < h->q_cap) {
        struct engine_event *slot = &h->q[(h->q_head + h->q_len) % h->q_cap];
        *slot = *ev;
        h->q_len++;
    } else {
        free(ev->text);
    }
    if (ev->type == ENGINE_EVENT_FINISH && ++h->n_finished == h->n_choices) {
        h->done = true;
        h->cr = NULL; /* the core frees its request after this event */
        e->n_active--;
    }
    h->refs++; /* h stays alive while we notify */
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&h->notify_mu);
    if (!h->released && h->notify) h->notify(h->ud);
    pthread_mutex_unlock(&h->notify_mu);
    pthread_mutex_lock(&e->mu);
    handle_unref_locked(h);
    pthread_mutex_unlock(&e->mu);
}

static void on_event(void *ud, const struct engine_event *ev) { on_event_stats(ud, ev, false); }
static void core_event(void *ud, const struct engine_event *ev) { on_event_stats(ud, ev, true); }

static void live_remove(struct engine *e, struct engine_handle *h) {
    for (struct engine_handle **p = &e->live; *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            return;
        }
}

/* Engine thread: admits new requests, applies cancels, drops finished handles. */
static void process_inbox(struct engine *e) {
    pthread_mutex_lock(&e->mu);
    struct engine_handle *in = e->inbox;
    e->inbox = NULL;
    pthread_mutex_unlock(&e->mu);
    struct engine_handle *fifo = NULL; /* the inbox is a stack: reverse it to FCFS order */
    while (in) {
        struct engine_handle *nx = in->next;
        in->next = fifo;
        fifo = in;
        in = nx;
    }
    in = fifo;
    for (struct engine_handle *h = in, *nx; h; h = nx) {
        nx = h->next;
        char err[256];
        int rc = core_add_owned(e->core, h->req, h->ge, core_event, h, &h->cr, err, sizeof err); /* takes both */
        h->req = NULL;
        h->ge = NULL;
        h->added = true;
        h->next = e->live;
        e->live = h;
        if (rc != ENGINE_OK) { /* rare: limits changed since submit; report and end */
            struct engine_event ev = {.type = ENGINE_EVENT_ERROR};
            snprintf(ev.message, sizeof ev.message, "%s", err);
            on_event(h, &ev);
            for (int i = 0; i < h->n_choices; i++) {
                struct engine_event f = {.type = ENGINE_EVENT_FINISH, .choice = i, .finish = ENGINE_FINISH_ABORT};
                on_event(h, &f);
            }
        }
    }
    /* cancels and releases */
    for (struct engine_handle *h = e->live, *nx; h; h = nx) {
        nx = h->next;
        pthread_mutex_lock(&e->mu);
        bool cancel = h->cancel && !h->done, done = h->done;
        pthread_mutex_unlock(&e->mu);
        if (cancel && h->cr) core_abort(e->core, h->cr); /* emits the FINISH events: done now */
        pthread_mutex_lock(&e->mu);
        done = h->done;
        if (done) {
            live_remove(e, h);
            handle_unref_locked(h);
        }
        pthread_mutex_unlock(&e->mu);
    }
}

/* Under e->mu: whether a request of n seats would find them free (nobody queued before it). */
static bool queue_fits(const struct engine *e, int n) {
    return e->q_unseated == 0 && n <= e->q_seats_left;
}

/* Under e->mu: a request of n seats joins, seated or queued. */
static void queue_count(struct engine *e, int n) {
    if (queue_fits(e, n)) e->q_seats_left -= n;
    else e->q_unseated++;
}

/* n_step: tokens the step just run computed (0: no step). */
static void update_stats(struct engine *e, int n_step) {
    struct engine_stats st;
    core_stats(e->core, &st);
    pthread_mutex_lock(&e->mu);
    memcpy(&e->stats, &st, offsetof(struct engine_stats, cache)); /* the rest is ours */
    if (n_step > 0) engine_hist_observe(&e->stats.hist[ENGINE_HIST_ITERATION_TOKENS], n_step);
    core_queue_state(e->core, &e->q_unseated, &e->q_seats_left);
    for (struct engine_handle *h = e->inbox; h; h = h->next) queue_count(e, h->n_choices);
    pthread_mutex_unlock(&e->mu);
}

/* Engine thread: the model cannot run another step. Every request still alive ends with an
 * error; submit refuses new ones from now on. */
static void engine_fail(struct engine *e) {
    pthread_mutex_lock(&e->mu);
    e->failed = e->draining = true;
    pthread_mutex_unlock(&e->mu);
    elog("error", "the %s backend failed for good: every request ends with an error", core_device(e->core));
    process_inbox(e); /* admits what was submitted, so that it is ended below */
    for (struct engine_handle *h = e->live; h; h = h->next) {
        pthread_mutex_lock(&e->mu);
        struct core_request *cr = h->done ? NULL : h->cr;
        pthread_mutex_unlock(&e->mu);
        if (!cr) continue;
        struct engine_event ev = {.type = ENGINE_EVENT_ERROR};
        snprintf(ev.message, sizeof ev.message, "the %s backend failed; the server is stopping", core_device(e->core));
        on_event(h, &ev);
        core_abort(e->core, cr);
    }
}

static void on_idle(uv_idle_t *idle) {
    struct engine *e = idle->data;
    process_inbox(e);
    int n_step = core_has_work(e->core) ? core_step(e->core) : 0;
    if (n_step == ENGINE_ERR_FATAL) engine_fail(e);
    process_inbox(e); /* drop what just finished */
    update_stats(e, n_step);
    if (!core_has_work(e->core)) uv_idle_stop(&e->idle);
}

static void on_wake(uv_async_t *a) {
    struct engine *e = a->data;
    pthread_mutex_lock(&e->mu);
    bool stopping = e->stopping;
    pthread_mutex_unlock(&e->mu);
    if (stopping) {
        uv_idle_stop(&e->idle);
        uv_close((uv_handle_t *)&e->idle, NULL);
        uv_close((uv_handle_t *)&e->wake, NULL);
        return;
    }
    process_inbox(e);
    update_stats(e, 0);
    if (core_has_work(e->core)) uv_idle_start(&e->idle, on_idle);
}

static void cache_info(struct engine *e, const struct engine_config *cfg) {
    const struct kv_cache *kv = core_kv(e->core);
    struct kv_cache_usage u;
    kv_cache_usage(kv, &u);
    e->stats.cache = (struct engine_cache_info){
        .block_size = kv_cache_block_size(kv),
        .num_gpu_blocks = kv_cache_has_full(kv) ? u.n_blocks : 0,
        .num_streaming_slots = kv_cache_has_stream(kv) ? u.n_slots : 0,
        .sink_tokens = core_config(e->core)->sink_tokens,
        .recent_tokens = core_config(e->core)->recent_tokens,
        .gpu_memory_utilization = cfg->gpu_memory_utilization > 0 ? cfg->gpu_memory_utilization : 0.9f,
        .cache_dtype = core_kv_dtype(e->core),
        .enable_prefix_caching = kv_cache_prefix_caching(kv),
    };
}

static void engine_thread(void *arg) {
    struct engine *e = arg;
    uv_run(&e->loop, UV_RUN_DEFAULT);
}

int engine_create(struct engine **out, const struct engine_config *cfg, char *err, size_t errlen) {
    *out = NULL;
    struct engine *e = calloc(1, sizeof *e);
    if (!e) return util_err(err, errlen, "out of memory");
    if (core_create(&e->core, cfg, err, errlen) != 0) {
        free(e);
        return -1;
    }
    /* warm-up: on a GPU the decode graphs of every batch size, before anyone is told "ready" */
    double t0 = util_now();
    int steps = warmup_run(e->core, strcmp(core_device(e->core), "cpu") ? core_max_num_seqs(e->core) : 0, err, errlen);
    if (steps < 0) {
        core_free(e->core);
        free(e);
        return -1;
    }
    if (steps && !cfg->quiet)
        elog("info", "warm-up: %d forward pass%s in %.0f ms", steps, steps == 1 ? "" : "es", (util_now() - t0) * 1e3);
    pthread_mutex_init(&e->mu, NULL);
    uv_loop_init(&e->loop);
    uv_async_init(&e->loop, &e->wake, on_wake);
    uv_idle_init(&e->loop, &e->idle);
    e->wake.data = e->idle.data = e;
    cache_info(e, cfg);
    hists_init(e);
    update_stats(e, 0);
    if (uv_thread_create(&e->thread, engine_thread, e) != 0) {
        uv_close((uv_handle_t *)&e->wake, NULL);
        uv_close((uv_handle_t *)&e->idle, NULL);
        uv_run(&e->loop, UV_RUN_DEFAULT);
        uv_loop_close(&e->loop);
        core_free(e->core);
        free(e);
        return util_err(err, errlen, "cannot start the engine thread");
    }
    *out = e;
    return 0;
}

void engine_destroy(struct engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->wake);
    uv_thread_join(&e->thread);
    uv_loop_close(&e->loop);
    /* whatever still runs is aborted (FINISH events); then the engine's references go */
    process_inbox(e);
    core_free(e->core);
    e->core = NULL;
    pthread_mutex_lock(&e->mu);
    for (struct engine_handle *h = e->live, *nx; h; h = nx) {
        nx = h->next;
        handle_unref_locked(h);
    }
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int engine_submit(struct engine *e, const struct engine_request *req, void (*notify)(void *ud), void *ud,
                  struct engine_handle **out, char *err, size_t errlen) {
    *out = NULL;
    int rc = core_validate(e->core, req, err, errlen);
    if (rc != ENGINE_OK) return rc;
    struct engine_handle *h = calloc(1, sizeof *h);
    if (!h) return util_err(err, errlen, "out of memory"), ENGINE_ERR_OOM;
    const struct engine_sampling *sp = &req->sp;
    h->e = e;
    h->notify = notify;
    h->ud = ud;
    h->refs = 2;
    pthread_mutex_init(&h->notify_mu, NULL);
    h->n_choices = sp->n;
    h->req = engine_request_clone(req);
    bool ok = h->req != NULL;
    /* structured output: compiled here, on the submitting thread, so a schema that does not
     * compile is refused at once */
    if (ok && sp->grammar.kind != ENGINE_GRAMMAR_NONE) {
        int grc = grammar_cache_acquire(core_grammar_cache(e->core), &sp->grammar, &h->ge, err, errlen);
        if (grc == GRAMMAR_ERR_NOMEM) ok = false;
        else if (grc) rc = ENGINE_ERR_GRAMMAR;
    }
    pthread_mutex_lock(&e->mu);
    if (rc == ENGINE_OK && !ok) rc = ENGINE_ERR_OOM, util_err(err, errlen, "out of memory");
    else if (rc == ENGINE_OK && e->failed)
        rc = ENGINE_ERR_DRAINING, util_err(err, errlen, "the engine failed; the server is stopping");
    else if (rc == ENGINE_OK && (e->draining || e->stopping))
        rc = ENGINE_ERR_DRAINING, util_err(err, errlen, "the server is shutting down");
    else if (rc == ENGINE_OK && !queue_fits(e, sp->n) && e->q_unseated >= core_max_queue(e->core))
        rc = ENGINE_ERR_QUEUE_FULL, util_err(err, errlen, "too many requests waiting (%d); retry later", e->q_unseated);
    if (rc != ENGINE_OK) {
        grammar_cache_release(core_grammar_cache(e->core), h->ge);
        h->refs = 1;
        handle_unref_locked(h);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    h->next = e->inbox;
    e->inbox = h;
    e->n_active++;
    queue_count(e, sp->n);
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->wake);
    *out = h;
    return ENGINE_OK;
}

int engine_poll(struct engine_handle *h, struct engine_event *ev) {
    struct engine *e = h->e;
    pthread_mutex_lock(&e->mu);
    int rc;
    if (h->q_len) {
        *ev = h->q[h->q_head];
        h->q_head = (h->q_head + 1) % h->q_cap;
        h->q_len--;
        rc = 1;
    } else {
        rc = h->done ? -1 : 0;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void engine_cancel(struct engine_handle *h) {
    struct engine *e = h->e;
    pthread_mutex_lock(&e->mu);
    h->cancel = true;
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->wake);
}

void engine_release(struct engine_handle *h) {
    if (!h) return;
    struct engine *e = h->e;
    pthread_mutex_lock(&h->notify_mu); /* waits for a notify in progress; none after this */
    h->released = true;
    pthread_mutex_unlock(&h->notify_mu);
    pthread_mutex_lock(&e->mu);
    h->cancel = true;
    handle_unref_locked(h);
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->wake);
}

void engine_drain(struct engine *e) {
    pthread_mutex_lock(&e->mu);
    e->draining = true;
    pthread_mutex_unlock(&e->mu);
}

int engine_num_active(struct engine *e) {
    pthread_mutex_lock(&e->mu);
    int n = e->n_active;
    pthread_mutex_unlock(&e->mu);
    return n;
}

bool engine_failed(struct engine *e) {
    pthread_mutex_lock(&e->mu);
    bool f = e->failed;
    pthread_mutex_unlock(&e->mu);
    return f;
}

void engine_get_stats(struct engine *e, struct engine_stats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->stats;
    pthread_mutex_unlock(&e->mu);
}

const struct tokenizer *engine_tokenizer(const struct engine *e) { return core_tokenizer(e->core); }
int engine_vocab_size(const struct engine *e) { return core_model(e->core)->cfg.vocab_size; }
int engine_max_model_len(const struct engine *e) { return core_max_model_len(e->core); }
int engine_max_num_seqs(const struct engine *e) { return core_max_num_seqs(e->core); }
const char *engine_model_dir(const struct engine *e) { return core_model_dir(e->core); }
