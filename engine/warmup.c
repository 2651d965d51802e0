/* warmup: the engine's own requests before it reports ready. */
#include "engine/warmup.h"

#include <stdbool.h>
#include <stdlib.h>

#include "engine/engine_core.h"
#include "engine/util.h"

#define WARMUP_LONG_PROMPT 128

static void warmup_emit(void *ud, const struct engine_event *ev) {
    if (ev->type == ENGINE_EVENT_ERROR) *(bool *)ud = true;
    free(ev->text);
}

int warmup_run(struct core *c, int max_batch, char *err, size_t errlen) {
    int max_len = core_max_model_len(c), vocab = core_model(c)->cfg.vocab_size;
    int n = max_batch < WARMUP_MAX_BATCH ? max_batch : WARMUP_MAX_BATCH;
    if (n > max_len - 3) n = max_len - 3; /* request i holds 2 + i + 2 tokens */
    bool tiny = n < 1;                    /* one 1-token prompt, one token out */
    if (tiny && max_len < 2) return 0;
    if (tiny) n = 1;
    int32_t prompt[WARMUP_LONG_PROMPT];
    for (int k = 0; k < WARMUP_LONG_PROMPT; k++) prompt[k] = (int32_t)((k * 7 + 1) % vocab);
    bool failed = false;
    for (int i = 0; i < n; i++) {
        struct engine_request req = {
            .prompt = prompt, .n_prompt = tiny ? 1 : 2,
            .sp = {.n = 1, .max_tokens = tiny ? 1 : i + 2, .temperature = i % 2 ? 1.0f : 0.0f, .top_p = 1.0f,
                   .repetition_penalty = 1.0f, .has_seed = true, .seed = (uint64_t)i, .ignore_eos = true,
                   .skip_special_tokens = true, .logprobs = -1},
        };
        if (i == 0 && !tiny) req.n_prompt = max_len - 2 < WARMUP_LONG_PROMPT ? max_len - 2 : WARMUP_LONG_PROMPT;
        char why[256];
        /* a KV pool or queue too small for all of them: warm up what fits */
        if (core_add(c, &req, warmup_emit, &failed, NULL, why, sizeof why) != ENGINE_OK) break;
    }
    int steps = 0;
    for (int guard = 0; core_has_work(c) && guard < 4 * n + 1000; guard++) {
        int rc = core_step(c);
        if (rc < 0) return util_err(err, errlen, "the %s backend failed during the warm-up", core_device(c));
        steps += rc > 0;
    }
    struct engine_stats st;
    core_stats(c, &st);
    if (failed || core_has_work(c) || st.kv_usage_full != 0.0 || st.kv_usage_streaming != 0.0)
        return util_err(err, errlen, "the warm-up requests did not finish cleanly");
    core_clear_prefix_cache(c);
    core_reset_stats(c);
    return steps;
}
