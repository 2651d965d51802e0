/* The threaded engine API (engine.h): submissions from several threads, notify-driven polling,
 * cancellation and early release free the KV, drain refuses new work, results equal the
 * synchronous core's, and the stats' histograms count what ran. */
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "tests/test_common.h"

#include "engine/engine.h"
#include "engine/util.h"

struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int wakeups;
};

static void notify(void *ud) {
    struct waiter *w = ud;
    pthread_mutex_lock(&w->mu);
    w->wakeups++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits for events until the request ends (bounded: 30 s); returns the token ids. */
static int drain_events(struct engine_handle *h, struct waiter *w, int32_t *ids, int cap, enum engine_finish *fin) {
    int n = 0;
    double deadline = util_now() + 30.0;
    for (;;) {
        struct engine_event ev;
        int rc = engine_poll(h, &ev);
        if (rc < 0) break;
        if (rc == 0) {
            pthread_mutex_lock(&w->mu);
            if (w->wakeups == 0) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50 * 1000000;
                if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
                pthread_cond_timedwait(&w->cv, &w->mu, &ts);
            }
            w->wakeups = 0;
            pthread_mutex_unlock(&w->mu);
            assert_true(util_now() < deadline);
            continue;
        }
        if (ev.type == ENGINE_EVENT_TOKEN && n < cap) ids[n++] = ev.token;
        if (ev.type == ENGINE_EVENT_FINISH && fin) *fin = ev.finish;
        free(ev.text);
    }
    return n;
}

static struct engine *start(int max_queue) {
    struct engine_config cfg = {.model_dir = "tests/fixtures/hf/llama2", .max_num_seqs = 16,
                                .max_num_batched_tokens = 64, .max_queue = max_queue, .quiet = true};
    struct engine *e;
    char err[512];
    assert_int_equal(engine_create(&e, &cfg, err, sizeof err), 0);
    return e;
}

static struct engine_sampling greedy(int n) {
    return (struct engine_sampling){.n = 1, .max_tokens = n, .top_p = 1, .repetition_penalty = 1,
                                    .ignore_eos = true, .skip_special_tokens = true, .logprobs = -1};
}

struct client {
    struct engine *e;
    int idx;
    int32_t ids[64];
    int n;
};

static void *client_main(void *arg) {
    struct client *c = arg;
    int32_t prompt[40];
    for (int i = 0; i < 10 + c->idx * 3; i++) prompt[i] = 5 + (i * 17 + c->idx) % 400;
    struct engine_request req = {prompt, 10 + c->idx * 3, greedy(24)};
    struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    struct engine_handle *h;
    char err[256];
    if (engine_submit(c->e, &req, notify, &w, &h, err, sizeof err) != ENGINE_OK) return NULL;
    c->n = drain_events(h, &w, c->ids, 64, NULL);
    engine_release(h);
    return NULL;
}

static void test_concurrent_clients_get_their_alone_results(void **state) {
    enum { NC = 8 };
    struct engine *e = start(64);
    struct client alone[NC], together[NC];
    for (int i = 0; i < NC; i++) { /* one at a time */
        alone[i] = (struct client){e, i, {0}, 0};
        client_main(&alone[i]);
        assert_int_equal(alone[i].n, 24);
    }
    pthread_t th[NC];
    for (int i = 0; i < NC; i++) {
        together[i] = (struct client){e, i, {0}, 0};
        pthread_create(&th[i], NULL, client_main, &together[i]);
    }
    for (int i = 0; i < NC; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NC; i++) {
        assert_int_equal(together[i].n, 24);
        assert_memory_equal(together[i].ids, alone[i].ids, sizeof(int32_t) * 24);
    }
    /* the stats are a snapshot the engine thread publishes after each step, so the last
     * client's FINISH can arrive just before the step that ran it is published (bounded wait) */
    struct engine_stats st;
    for (int i = 0; i < 200; i++) {
        engine_get_stats(e, &st);
        if (st.num_running == 0 && engine_num_active(e) == 0) break;
        usleep(10000);
    }
    assert_int_equal(st.num_running, 0);
    assert_true(st.kv_usage_full == 0.0);
    assert_int_equal(engine_num_active(e), 0);
    engine_destroy(e);
}

static void test_cancel_and_release_free_the_kv(void **state) {
    struct engine *e = start(64);
    int32_t prompt[30];
    for (int i = 0; i < 30; i++) prompt[i] = 7 + i;
    struct engine_request req = {prompt, 30, greedy(1000)};
    struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    struct engine_handle *h1, *h2;
    char err[256];
    assert_int_equal(engine_submit(e, &req, notify, &w, &h1, err, sizeof err), ENGINE_OK);
    assert_int_equal(engine_submit(e, &req, NULL, NULL, &h2, err, sizeof err), ENGINE_OK);
    /* let them run, then cancel one and drop the other without reading it */
    struct engine_event ev;
    int got = 0;
    for (double t0 = util_now(); got < 3 && util_now() - t0 < 30;) {
        if (engine_poll(h1, &ev) == 1) {
            got += ev.type == ENGINE_EVENT_TOKEN;
            free(ev.text);
        }
    }
    assert_int_equal(got, 3);
    engine_cancel(h1);
    engine_release(h2);
    enum engine_finish fin = ENGINE_FINISH_NONE;
    int32_t ids[1000];
    int n = drain_events(h1, &w, ids, 1000, &fin);
    assert_int_equal(fin, ENGINE_FINISH_ABORT);
    assert_true(n < 997);
    engine_release(h1);
    struct engine_stats st;
    for (double t0 = util_now(); util_now() - t0 < 10;) {
        engine_get_stats(e, &st);
        if (st.num_running == 0 && st.kv_usage_full == 0.0) break;
        usleep(1000);
    }
    assert_int_equal(st.num_running, 0);
    assert_true(st.kv_usage_full == 0.0);
    assert_true(st.finished_abort >= 2);
    engine_destroy(e);
}

static void test_drain_refuses_and_queue_limit_applies(void **state) {
    struct engine *e = start(2);
    int32_t prompt[4] = {1, 2, 3, 4};
    struct engine_request req = {prompt, 4, greedy(200)};
    struct engine_handle *h[4] = {0};
    char err[256];
    int ok = 0, full = 0;
    for (int i = 0; i < 4; i++) {
        int rc = engine_submit(e, &req, NULL, NULL, &h[i], err, sizeof err);
        ok += rc == ENGINE_OK;
        full += rc == ENGINE_ERR_QUEUE_FULL;
    }
    assert_true(ok >= 2);
    assert_true(ok + full == 4);
    engine_drain(e);
    struct engine_handle *hx;
    assert_int_equal(engine_submit(e, &req, NULL, NULL, &hx, err, sizeof err), ENGINE_ERR_DRAINING);
    for (int i = 0; i < 4; i++)
        if (h[i]) engine_release(h[i]);
    engine_destroy(e); /* with requests possibly still running: they are aborted */
}

/* Submissions a free seat waits for are not queued: a burst into an idle engine with 16 seats
 * and a queue of 2 is admitted whole, however far the engine thread has got; once the seats
 * are taken, 2 more wait and the next is refused. */
static void test_queue_limit_counts_only_requests_without_a_seat(void **state) {
    struct engine *e = start(2);
    int32_t prompt[4] = {1, 2, 3, 4};
    struct engine_request req = {prompt, 4, greedy(1500)};
    struct engine_handle *h[19] = {0};
    char err[256];
    for (int i = 0; i < 16; i++) assert_int_equal(engine_submit(e, &req, NULL, NULL, &h[i], err, sizeof err), ENGINE_OK);
    assert_int_equal(engine_submit(e, &req, NULL, NULL, &h[16], err, sizeof err), ENGINE_OK);
    assert_int_equal(engine_submit(e, &req, NULL, NULL, &h[17], err, sizeof err), ENGINE_OK);
    assert_int_equal(engine_submit(e, &req, NULL, NULL, &h[18], err, sizeof err), ENGINE_ERR_QUEUE_FULL);
    for (int i = 0; i < 18; i++) engine_release(h[i]);
    engine_destroy(e);
}

static void test_hist_buckets_are_upper_inclusive(void **state) {
    static const double b[] = {1, 2, 5};
    struct engine_hist h;
    engine_hist_init(&h, b, 3);
    double v[] = {-3, NAN, 0.5, 1, 1.5, 2, 5, 5.01, 1e9};
    for (int i = 0; i < 9; i++) engine_hist_observe(&h, v[i]);
    assert_int_equal(h.count, 9);
    assert_int_equal(h.counts[0], 4); /* -3 and NaN count as 0; 1 is in le=1 */
    assert_int_equal(h.counts[1], 2);
    assert_int_equal(h.counts[2], 1);
    assert_int_equal(h.counts[3], 2); /* +Inf */
    assert_true(fabs(h.sum - (0.5 + 1 + 1.5 + 2 + 5 + 5.01 + 1e9)) < 1e-3);
}

/* One request of 10 prompt and 24 generated tokens: every request histogram counts it once,
 * the token gaps add up to its decode time, the steps computed 10 + 23 tokens. */
static void test_stats_histograms_count_a_request(void **state) {
    struct engine *e = start(64);
    int32_t prompt[10];
    for (int i = 0; i < 10; i++) prompt[i] = 11 + i;
    struct engine_request req = {prompt, 10, greedy(24)};
    struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    struct engine_handle *h;
    char err[256];
    assert_int_equal(engine_submit(e, &req, notify, &w, &h, err, sizeof err), ENGINE_OK);
    int32_t ids[64];
    assert_int_equal(drain_events(h, &w, ids, 64, NULL), 24);
    engine_release(h);
    struct engine_stats st;
    for (int i = 0; i < 200; i++) { /* published after the step (bounded wait) */
        engine_get_stats(e, &st);
        if (st.num_running == 0 && st.hist[ENGINE_HIST_ITERATION_TOKENS].sum == 33) break;
        usleep(10000);
    }
    const struct engine_hist *hs = st.hist;
    static const int per_request[] = {ENGINE_HIST_QUEUE,         ENGINE_HIST_PREFILL,      ENGINE_HIST_DECODE,
                                      ENGINE_HIST_INFERENCE,     ENGINE_HIST_REQUEST_TPOT, ENGINE_HIST_PROMPT_TOKENS,
                                      ENGINE_HIST_GENERATION_TOKENS};
    for (int k = 0; k < 7; k++) assert_int_equal(hs[per_request[k]].count, 1);
    assert_true(hs[ENGINE_HIST_QUEUE].sum > 0 && hs[ENGINE_HIST_PREFILL].sum > 0 && hs[ENGINE_HIST_DECODE].sum > 0);
    assert_true(fabs(hs[ENGINE_HIST_INFERENCE].sum - hs[ENGINE_HIST_PREFILL].sum - hs[ENGINE_HIST_DECODE].sum) < 1e-9);
    assert_int_equal(hs[ENGINE_HIST_TPOT].count, 23);
    assert_true(fabs(hs[ENGINE_HIST_TPOT].sum - hs[ENGINE_HIST_DECODE].sum) < 1e-9);
    assert_true(fabs(hs[ENGINE_HIST_REQUEST_TPOT].sum - hs[ENGINE_HIST_DECODE].sum / 23) < 1e-9);
    assert_true(hs[ENGINE_HIST_PROMPT_TOKENS].sum == 10 && hs[ENGINE_HIST_GENERATION_TOKENS].sum == 24);
    assert_true(hs[ENGINE_HIST_ITERATION_TOKENS].sum == 33);
    assert_int_equal(hs[ENGINE_HIST_ITERATION_TOKENS].count, 24); /* one prefill step (10 <= 64), 23 decodes */
    /* token counts: vLLM's 1-2-5 bounds up to max_model_len */
    const struct engine_hist *pt = &hs[ENGINE_HIST_PROMPT_TOKENS];
    assert_true(pt->n_bounds >= 3 && pt->bounds[0] == 1 && pt->bounds[1] == 2 && pt->bounds[2] == 5);
    assert_true(pt->bounds[pt->n_bounds - 1] <= engine_max_model_len(e) &&
                pt->bounds[pt->n_bounds - 1] * 2 > engine_max_model_len(e));
    assert_int_equal(st.cache.block_size, 16);
    assert_int_equal(st.cache.num_gpu_blocks * 16, st.kv_capacity_tokens);
    engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hist_buckets_are_upper_inclusive),
        cmocka_unit_test(test_stats_histograms_count_a_request),
        cmocka_unit_test(test_concurrent_clients_get_their_alone_results),
        cmocka_unit_test(test_cancel_and_release_free_the_kv),
        cmocka_unit_test(test_drain_refuses_and_queue_limit_applies),
        cmocka_unit_test(test_queue_limit_counts_only_requests_without_a_seat),
    };
    return cmocka_run_group_tests_name("engine_thread", tests, NULL, NULL);
}
