#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

int sampler_argmax(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

void sampler_log_softmax(const float *logits, int n, float *out) {
    float mx = logits[sampler_argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    double lse = (double)mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = (float)((double)logits[i] - lse);
}

void sampler_top_k(const float *logprobs, int n, int k, int32_t *ids, float *vals) {
    if (k > n) k = n;
    int filled = 0;
    /* insertion into a sorted list of k: k is small (<= 20) */
    for (int i = 0; i < n; i++) {
        float v = logprobs[i];
        if (filled == k && !(v > vals[k - 1])) continue;
        int j = filled < k ? filled++ : k - 1;
        while (j > 0 && v > vals[j - 1]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = v;
        ids[j] = i;
    }
}

int sampler_sample(const float *logits, int n, float temperature, struct util_rng *rng) {
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

#include <string.h>

#include "engine/engine.h"

int sampler_seq_init(struct sampler_seq *s, const struct engine_sampling *sp, uint64_t seed, int choice, int vocab,
                     const int32_t *prompt, int n_prompt) {
    memset(s, 0, sizeof *s);
    /* a distinct, reproducible stream per choice */
    util_rng_seed(&s->rng, seed * 0x9e3779b97f4a7c15ull + (uint64_t)choice * 0xd1b54a32d192ed03ull + 1);
    if (sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f) {
        s->counts = calloc((size_t)vocab, sizeof *s->counts);
        if (!s->counts) return -1;
    }
    if (sp->repetition_penalty != 1.0f && sp->repetition_penalty > 0.0f) {
        s->in_prompt = calloc((size_t)vocab, 1);
        if (!s->in_prompt) {
            free(s->counts);
            s->counts = NULL;
            return -1;
        }
        for (int i = 0; i < n_prompt; i++)
            if (prompt[i] >= 0 && prompt[i] < vocab) s->in_prompt[prompt[i]] = 1;
    }
    return 0;
}

void sampler_seq_free(struct sampler_seq *s) {
    if (!s) return;
    free(s->counts);
    free(s->in_prompt);
    s->counts = NULL;
    s->in_prompt = NULL;
}

void sampler_seq_accept(struct sampler_seq *s, int32_t id) {
    if (s->counts) s->counts[id]++;
    if (s->in_prompt) s->in_prompt[id] = 1;
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

int sampler_pick(struct sampler_seq *s, const struct engine_sampling *sp, float *l, int V, int n_generated,
                 const int32_t *eos, int n_eos, float *scratch) {
    for (int i = 0; i < sp->n_logit_bias; i++) l[sp->logit_bias_ids[i]] += sp->logit_bias_vals[i];
    if (n_generated < sp->min_tokens) { /* vLLM: EOS and stop ids cannot end the output yet */
        for (int i = 0; i < n_eos; i++) l[eos[i]] = -INFINITY;
        for (int i = 0; i < sp->n_stop_ids; i++) l[sp->stop_ids[i]] = -INFINITY;
    }
    if (s->in_prompt) { /* HF/vLLM repetition penalty over prompt and output tokens */
        float p = sp->repetition_penalty;
        for (int i = 0; i < V; i++)
            if (s->in_prompt[i]) l[i] = l[i] > 0 ? l[i] / p : l[i] * p;
    }
    if (s->counts) { /* OpenAI presence / frequency penalties over output tokens */
        for (int i = 0; i < V; i++)
            if (s->counts[i]) l[i] -= sp->frequency_penalty * (float)s->counts[i] + sp->presence_penalty;
    }
    /* temperatures this small are greedy (vLLM's epsilon); dividing by them overflows */
    if (!(sp->temperature >= 1e-5f)) return sampler_argmax(l, V);

    for (int i = 0; i < V; i++) l[i] /= sp->temperature;
    /* top-k: keep logits >= the k-th largest */
    if (sp->top_k > 0 && sp->top_k < V) {
        memcpy(scratch, l, sizeof(float) * V);
        qsort(scratch, V, sizeof(float), cmp_desc);
        float kth = scratch[sp->top_k - 1];
        for (int i = 0; i < V; i++)
            if (l[i] < kth) l[i] = -INFINITY;
    }
    /* softmax */
    float mx = l[sampler_argmax(l, V)];
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        scratch[i] = isinf(l[i]) && l[i] < 0 ? 0.0f : expf(l[i] - mx);
        sum += scratch[i];
    }
    if (!(sum > 0.0) || !isfinite(sum)) return sampler_argmax(l, V); /* every token masked, or overflow */
    for (int i = 0; i < V; i++) scratch[i] = (float)(scratch[i] / sum);
    /* min-p: drop tokens below min_p * max prob */
    if (sp->min_p > 0.0f) {
        float pmax = 0.0f;
        for (int i = 0; i < V; i++) pmax = scratch[i] > pmax ? scratch[i] : pmax;
        for (int i = 0; i < V; i++)
            if (scratch[i] < sp->min_p * pmax) scratch[i] = 0.0f;
    }
    /* top-p: the smallest set of most likely tokens whose mass reaches top_p */
    if (sp->top_p < 1.0f) {
        float *sorted = malloc(sizeof(float) * V);
        if (sorted) {
            memcpy(sorted, scratch, sizeof(float) * V);
            qsort(sorted, V, sizeof(float), cmp_desc);
            double tot = 0.0, acc = 0.0;
            for (int i = 0; i < V; i++) tot += sorted[i];
            float cut = sorted[0];
            for (int i = 0; i < V; i++) {
                acc += sorted[i];
                cut = sorted[i];
                if (acc >= sp->top_p * tot) break;
            }
            for (int i = 0; i < V; i++)
                if (scratch[i] < cut) scratch[i] = 0.0f;
            free(sorted);
        }
    }
    double tot = 0.0;
    for (int i = 0; i < V; i++) tot += scratch[i];
    double r = (double)util_rng_uniform(&s->rng) * tot, acc = 0.0;
    int last = -1;
    for (int i = 0; i < V; i++) {
        if (scratch[i] <= 0.0f) continue;
        acc += scratch[i];
        last = i;
        if (r < acc) return i;
    }
    return last >= 0 ? last : sampler_argmax(l, V);
}
