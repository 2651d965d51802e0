/* check_invariance: greedy ids of several requests of different lengths, run alone, all at once
 * with several prefill budgets, and under a KV pool small enough to preempt, on any backend; and a
 * request served from the prefix cache (its prompt's first blocks left by an earlier request)
 * against the same request on a cold cache. Prints one line per configuration and exits 1 on any
 * difference. Used on the GPU machine:
 *   build/check_invariance MODEL_DIR cuda [PATTERN.tsv SPARSITY] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_cache_impl.h"
#include "engine/engine_core.h"

#define NR 6
#define NG 24

struct out {
    int32_t ids[NG];
    int n;
};

static void on_event(void *ud, const struct engine_event *ev) {
    struct out *o = ud;
    if (ev->type == ENGINE_EVENT_TOKEN && o->n < NG) o->ids[o->n++] = ev->token;
    free(ev->text);
}

/* An engine of the checks' shape (sink 4, recent 8, 16 seats), or NULL with the error printed. */
static struct core *open_engine(const char *dir, const char *dev, const char *pat, float sp, int budget, size_t kv) {
    struct engine_config cfg = {.model_dir = dir, .device = dev, .max_num_batched_tokens = budget, .max_num_seqs = 16,
                                .kv_cache_memory = kv, .duo_pattern = pat, .duo_sparsity = sp, .sink_tokens = 4,
                                .recent_tokens = 8, .quiet = true};
    struct core *c;
    char err[512];
    if (core_create(&c, &cfg, err, sizeof err)) {
        fprintf(stderr, "check_invariance: %s\n", err);
        return NULL;
    }
    return c;
}

/* A greedy request of NG tokens whose ids go to o. */
static int add_request(struct core *c, const int32_t *prompt, int len, struct out *o) {
    struct engine_sampling s = {.n = 1, .max_tokens = NG, .top_p = 1, .repetition_penalty = 1, .ignore_eos = true,
                                .skip_special_tokens = true, .logprobs = -1};
    struct engine_request req = {prompt, len, s};
    char err[512];
    o->n = 0;
    if (core_add(c, &req, on_event, o, NULL, err, sizeof err)) {
        fprintf(stderr, "check_invariance: %s\n", err);
        return -1;
    }
    return 0;
}

static int drain(struct core *c) {
    while (core_has_work(c))
        if (core_step(c) < 0) return -1;
    return 0;
}

static int run(const char *dir, const char *dev, const char *pat, float sp, int budget, size_t kv, int alone_idx,
               struct out *outs, unsigned long long *preempt) {
    struct core *c = open_engine(dir, dev, pat, sp, budget, kv);
    if (!c) return -1;
    int V = core_model(c)->cfg.vocab_size;
    for (int r = 0; r < NR; r++) {
        if (alone_idx >= 0 && r != alone_idx) continue;
        static int32_t prompt[400];
        int len = 1 + r * 61;
        for (int i = 0; i < len; i++) prompt[i] = 3 + (r * 101 + i * 37) % (V - 3);
        if (add_request(c, prompt, len, &outs[r])) return -1;
    }
    if (drain(c)) return -1;
    struct engine_stats st;
    core_stats(c, &st);
    *preempt = st.preemptions_total;
    core_free(c);
    return 0;
}

/* Request B = A's prompt + a tail (a chat's next turn), after request A in the same engine (warm:
 * B's first blocks, and with a pattern the streaming heads' state at A's end, come from the prefix
 * cache) or alone in a fresh one (cold): B's ids, and the prompt tokens the prefix cache found.
 * A's prompt ends mid-block. */
static int run_prefix(const char *dir, const char *dev, const char *pat, float sp, bool warm, struct out *o,
                      unsigned long long *found) {
    struct core *c = open_engine(dir, dev, pat, sp, 4096, 0);
    if (!c) return -1;
    int V = core_model(c)->cfg.vocab_size;
    enum { A_LEN = 150, B_LEN = 183 }; /* A: B's first 150 tokens */
    int32_t b[B_LEN];
    for (int i = 0; i < B_LEN; i++) b[i] = 3 + (i < A_LEN ? 7 + i * 53 : 5 + i * 41) % (V - 3);
    struct out oa;
    if (warm && (add_request(c, b, A_LEN, &oa) || drain(c))) return -1;
    if (add_request(c, b, B_LEN, o) || drain(c)) return -1;
    struct engine_stats st;
    core_stats(c, &st);
    *found = st.prefix_cache_hits;
    core_free(c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR cpu|cuda [PATTERN SPARSITY]\n", argv[0]);
        return 2;
    }
    const char *pat = argc > 4 ? argv[3] : NULL;
    float sp = argc > 4 ? (float)atof(argv[4]) : 0;
    struct out alone[NR], mixed[NR];
    unsigned long long pre = 0;
    for (int r = 0; r < NR; r++)
        if (run(argv[1], argv[2], pat, sp, 4096, 0, r, alone, &pre)) return 1;
    struct {
        int budget;
        size_t kv;
    } cfgs[] = {{4096, 0}, {16, 0}, {7, 0}, {256, 0}, {64, 0}};
    /* last: a pool of 22 blocks of the smallest model shapes we use here; forces preemption */
    int fails = 0;
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        size_t kv = cfgs[k].kv;
        if (k == 4) kv = 1; /* sentinel: planned below as 22 blocks */
        if (k == 4) {
            struct core *c = open_engine(argv[1], argv[2], pat, sp, 0, 0);
            if (!c) return 1;
            const struct kv_cache *kvc = core_kv(c);
            struct kv_geometry g;
            model_kv_geometry(core_model(c), 16, 4, 8, &g);
            struct kv_cache_usage u; /* the slots the plan makes for 16 seats (and the prefix cache's snapshots) */
            kv_cache_usage(kvc, &u);
            kv = 22 * kv_cache_block_bytes(&g, kvc->b->ops->act_size) + (size_t)u.n_slots * kv_cache_slot_bytes(&g, kvc->b->ops->act_size);
            core_free(c);
        }
        if (run(argv[1], argv[2], pat, sp, cfgs[k].budget, kv, -1, mixed, &pre)) return 1;
        int diff = 0;
        for (int r = 0; r < NR; r++) diff += memcmp(alone[r].ids, mixed[r].ids, sizeof alone[r].ids) != 0;
        printf("%s %s budget %5d%s: %d of %d requests differ from alone (%llu preemptions)\n", argv[2],
               pat ? "duo" : "full", cfgs[k].budget, k == 4 ? " small pool" : "", diff, NR, pre);
        fails += diff;
    }
    struct out cold, warm;
    unsigned long long found_cold = 0, found_warm = 0;
    if (run_prefix(argv[1], argv[2], pat, sp, false, &cold, &found_cold) ||
        run_prefix(argv[1], argv[2], pat, sp, true, &warm, &found_warm))
        return 1;
    int pdiff = memcmp(cold.ids, warm.ids, sizeof cold.ids) != 0 || cold.n != NG || warm.n != NG;
    printf("%s %s prefix cache: %s (prompt tokens found: %llu warm, %llu cold)\n", argv[2], pat ? "duo" : "full",
           pdiff ? "a request served from it differs from the same request cold" : "a request served from it equals "
           "the same request cold", found_warm, found_cold);
    fails += pdiff + (found_warm == 0); /* (a warm run that found nothing checked nothing) */
    printf("invariance: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
