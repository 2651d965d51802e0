/* bench_engine: engine throughput on the CPU backend. Runs C concurrent greedy requests (each
 * the same prompt, ignore_eos, N new tokens) through the engine core and reports output
 * tokens/s, for each C given. Batching must raise throughput, not only keep it.
 *
 *   build/bench_engine MODEL_DIR [N_TOKENS] [C...]      (default: 128 tokens, C = 1 8 32) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_core.h"
#include "engine/util.h"

static int n_tokens_seen;

static void on_event(void *ud, const struct engine_event *ev) {
    if (ev->type == ENGINE_EVENT_TOKEN) n_tokens_seen++;
    free(ev->text);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [N_TOKENS] [CONCURRENCY...]\n", argv[0]);
        return 2;
    }
    int n_new = argc > 2 ? atoi(argv[2]) : 128;
    int levels[16] = {1, 8, 32}, n_levels = 3;
    if (argc > 3) {
        n_levels = 0;
        for (int i = 3; i < argc && n_levels < 16; i++) levels[n_levels++] = atoi(argv[i]);
    }
    int max_c = 1;
    for (int i = 0; i < n_levels; i++) max_c = levels[i] > max_c ? levels[i] : max_c;
    struct engine_config cfg = {.model_dir = argv[1], .max_num_seqs = max_c, .max_num_batched_tokens = 2048,
                                .quiet = true};
    struct core *c;
    char err[512];
    if (core_create(&c, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "bench_engine: %s\n", err);
        return 1;
    }
    int32_t prompt[8] = {1, 403, 407, 261, 378, 432, 383, 286};
    printf("model %s, %d new tokens per request, prompt 8 tokens, CPU backend (1 thread)\n", argv[1], n_new);
    printf("%12s %14s %12s %16s\n", "concurrency", "output tokens", "seconds", "output tok/s");
    for (int li = 0; li < n_levels; li++) {
        int C = levels[li];
        struct engine_sampling sp = {.n = 1, .max_tokens = n_new, .top_p = 1, .repetition_penalty = 1,
                                     .ignore_eos = true, .skip_special_tokens = true, .logprobs = -1};
        n_tokens_seen = 0;
        double t0 = util_now();
        for (int i = 0; i < C; i++) {
            struct engine_request req = {prompt, 8, sp};
            if (core_add(c, &req, on_event, NULL, NULL, err, sizeof err) != ENGINE_OK) {
                fprintf(stderr, "bench_engine: %s\n", err);
                return 1;
            }
        }
        while (core_has_work(c)) core_step(c);
        double dt = util_now() - t0;
        printf("%12d %14d %12.3f %16.1f\n", C, n_tokens_seen, dt, n_tokens_seen / dt);
    }
    core_free(c);
    return 0;
}
