/* Test helper: generate_run runs one request to completion on a model, without the engine's
 * scheduler (prefill in chunks, then decode one token a step, one sequence, a KV cache of its
 * own): the simplest correct driver of the forward pass, which tests/test_model.c and
 * tests/test_tp.c check the model with (chunked prefill, tensor-parallel ranks, HF tokens). */
#ifndef DUO_TEST_GENERATE_REF_H
#define DUO_TEST_GENERATE_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_cache_impl.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/util.h"

struct gen_params {
    int max_tokens;    // tokens to generate
    float temperature; // 0 = greedy
    uint64_t seed;
    int top_logprobs;  // K most likely tokens reported per generated position (0..20)
    int prefill_chunk; // prompt tokens per forward step (>= 1)
    bool ignore_eos;   // keep going past an EOS id of the config
};

struct gen_result {
    int32_t *ids;       // [n] generated ids
    int n;
    int32_t *top_ids;   // [n][top_logprobs]
    float *top_lps;     // [n][top_logprobs]
    bool stopped_eos;   // finished on an EOS id (included in ids)
};

#define GEN_BLOCK_SIZE 16

/* Greedy at temperature 0, else a draw from softmax(logits / temperature). */
static int ref_sample(const float *logits, int n, float temperature, struct util_rng *rng) {
    if (!(temperature > 0.0f)) return sampler_argmax(logits, n);
    float mx = logits[sampler_argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp(((double)logits[i] - mx) / temperature);
    double r = (double)util_rng_uniform(rng) * sum, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += exp(((double)logits[i] - mx) / temperature);
        if (r < acc) return i;
    }
    return sampler_argmax(logits, n);
}

static inline void gen_result_free(struct gen_result *r) {
    if (!r) return;
    free(r->ids);
    free(r->top_ids);
    free(r->top_lps);
    memset(r, 0, sizeof *r);
}

static inline bool gen_is_eos(const struct model_config *c, int id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return true;
    return false;
}

static inline int generate_run(struct model *m, const int32_t *prompt, int n_prompt, const struct gen_params *p,
                               struct gen_result *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const struct model_config *c = &m->cfg;
    int V = c->vocab_size, K = p->top_logprobs;
    if (n_prompt < 1) return util_err(err, errlen, "the prompt is empty");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return util_err(err, errlen, "prompt token %d is outside the vocabulary (0..%d)", prompt[i], V - 1);
    if (K < 0 || K > 20) return util_err(err, errlen, "top_logprobs must be in 0..20");
    int total = n_prompt + p->max_tokens;
    if (total > c->max_pos)
        return util_err(err, errlen, "prompt (%d) + max tokens (%d) exceeds the model's context of %d tokens",
                        n_prompt, p->max_tokens, c->max_pos);
    int chunk = p->prefill_chunk > 0 ? p->prefill_chunk : m->max_tokens;
    if (chunk > m->max_tokens) chunk = m->max_tokens;

    int n_blocks = (total + GEN_BLOCK_SIZE - 1) / GEN_BLOCK_SIZE;
    struct kv_cache kv;
    if (model_kv_cache_init(m, &kv, GEN_BLOCK_SIZE, 0, 1, n_blocks, 1) != KV_STATUS_OK)
        return util_err(err, errlen, "out of memory for the KV cache of %d tokens", total);
    int32_t *blocks = malloc(sizeof *blocks * (size_t)n_blocks);
    int32_t *toks = malloc(sizeof *toks * (size_t)total), *pos = malloc(sizeof *pos * (size_t)chunk);
    float *logits = malloc(sizeof *logits * (size_t)V), *lp = malloc(sizeof *lp * (size_t)V);
    out->ids = malloc(sizeof *out->ids * (size_t)(p->max_tokens + 1));
    out->top_ids = malloc(sizeof *out->top_ids * (size_t)(p->max_tokens * K + 1));
    out->top_lps = malloc(sizeof *out->top_lps * (size_t)(p->max_tokens * K + 1));
    int rc = 0;
    if (!blocks || !toks || !pos || !logits || !lp || !out->ids || !out->top_ids || !out->top_lps) {
        rc = util_err(err, errlen, "out of memory");
        goto done;
    }
    kv_cache_alloc(&kv, n_blocks, blocks);
    memcpy(toks, prompt, sizeof *toks * (size_t)n_prompt);
    struct util_rng rng;
    util_rng_seed(&rng, p->seed);

    int done_upto = 0, n_tok = n_prompt; /* positions < done_upto are in the cache */
    while (out->n < p->max_tokens) {
        int n = n_tok - done_upto;
        if (n > chunk) n = chunk;
        for (int i = 0; i < n; i++) pos[i] = done_upto + i;
        int32_t seq_start[2] = {0, n}, indptr[2] = {0, n_blocks}, row = n - 1;
        bool last = done_upto + n == n_tok;
        int32_t slot = 0;
        struct fwd_batch bt = {n, 1, toks + done_upto, pos, seq_start, indptr, blocks, &slot, last ? 1 : 0, &row, NULL, false};
        if (model_forward(m, &kv, &bt, logits) != 0) {
            rc = util_err(err, errlen, "forward pass failed on the %s backend", m->b->name);
            goto done;
        }
        done_upto += n;
        if (!last) continue;
        int id = ref_sample(logits, V, p->temperature, &rng);
        if (K) {
            sampler_log_softmax(logits, V, lp);
            sampler_top_k(lp, V, K, out->top_ids + (size_t)out->n * K, out->top_lps + (size_t)out->n * K);
        }
        out->ids[out->n++] = id;
        toks[n_tok++] = id;
        if (!p->ignore_eos && gen_is_eos(c, id)) {
            out->stopped_eos = true;
            break;
        }
    }
done:
    free(blocks);
    free(toks);
    free(pos);
    free(logits);
    free(lp);
    kv_cache_free(&kv);
    if (rc) gen_result_free(out);
    return rc;
}

#endif
