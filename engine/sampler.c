#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/request.h"

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



int sampler_seq_init(struct sampler_seq *s, const struct engine_sampling *sp, uint64_t seed, int choice, int vocab,
                     const int32_t *prompt, int n_prompt) {
    memset(s, 0, sizeof *s);
    /* a distinct, reproducible stream per choice */
    util_rng_seed(&s->rng, seed * 0x9e3779b97f4a7c15ull + (uint64_t)choice * 0xd1b54a32d192ed03ull + 1);
    bool rep = sp->repetition_penalty != 1.0f && sp->repetition_penalty > 0.0f;
    if (!rep && sp->presence_penalty == 0.0f && sp->frequency_penalty == 0.0f) return 0;
    /* room for every id the prompt (when it counts) and the output can add: accept never grows it */
    int cap = (rep ? n_prompt : 0) + sp->max_tokens;
    s->seen_cap = cap < vocab ? cap : vocab;
    s->slot = calloc((size_t)vocab, sizeof *s->slot);
    s->seen = malloc(sizeof *s->seen * (size_t)(s->seen_cap + 1));
    if (!s->slot || !s->seen) {
        sampler_seq_free(s);
        return -1;
    }
    for (int i = 0; rep && i < n_prompt; i++) {
        int32_t id = prompt[i];
        if (id < 0 || id >= vocab || s->slot[id] || s->n_seen == s->seen_cap) continue;
        s->seen[s->n_seen] = (struct sample_seen){id, 0, 1};
        s->slot[id] = ++s->n_seen;
    }
    return 0;
}

void sampler_seq_free(struct sampler_seq *s) {
    if (!s) return;
    free(s->slot);
    free(s->seen);
    s->slot = NULL;
    s->seen = NULL;
    s->n_seen = s->seen_cap = 0;
}

void sampler_seq_accept(struct sampler_seq *s, int32_t id) {
    if (!s->slot) return;
    if (!s->slot[id]) {
        if (s->n_seen == s->seen_cap) return; /* not reached: seen_cap covers max_tokens */
        s->seen[s->n_seen] = (struct sample_seen){id, 0, 0};
        s->slot[id] = ++s->n_seen;
    }
    s->seen[s->slot[id] - 1].count++;
}

void sampler_row(struct sample_row *p, struct sampler_seq *s, const struct engine_sampling *sp, int n_generated,
                 const int32_t *mask, int n_mask) {
    *p = (struct sample_row){.temperature = sp->temperature, .top_k = sp->top_k, .top_p = sp->top_p,
                             .min_p = sp->min_p, .repetition_penalty = sp->repetition_penalty,
                             .presence_penalty = sp->presence_penalty, .frequency_penalty = sp->frequency_penalty,
                             .n_bias = sp->n_logit_bias, .bias_ids = sp->logit_bias_ids,
                             .bias_vals = sp->logit_bias_vals, .n_seen = s->n_seen, .seen = s->seen,
                             .allow = s->allow};
    if (n_generated < sp->min_tokens) { /* vLLM: EOS and stop ids cannot end the output yet */
        p->n_mask = n_mask;
        p->mask_ids = mask;
    }
    if (sp->temperature >= 1e-5f) p->u = util_rng_uniform(&s->rng);
}

/* The k-th largest (k >= 1) of a[n], the value a descending sort puts at index k - 1:
 * quickselect with a three-way partition (masked -inf runs stay cheap); a is reordered. */
static float kth_largest(float *a, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi]; /* median of three */
        float pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int lt = lo, i = lo, gt = hi; /* [lo, lt) > pivot, [lt, i) == pivot, (gt, hi] < pivot */
        while (i <= gt) {
            float v = a[i];
            if (v > pivot) a[i++] = a[lt], a[lt++] = v;
            else if (v < pivot) a[i] = a[gt], a[gt--] = v;
            else i++;
        }
        if (want < lt) hi = lt - 1;
        else if (want > gt) lo = gt + 1;
        else return pivot;
    }
    return a[lo];
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Sorts n positive finite floats into descending order: a radix sort on their bits (for positive
 * floats, the bits order as the values do), four 8-bit passes through tmp[n]. */
static void sort_desc_positive(float *a, int n, float *tmp) {
    for (int shift = 0; shift < 32; shift += 8) {
        int count[256] = {0}, start[256];
        for (int i = 0; i < n; i++) count[(float_bits(a[i]) >> shift) & 255]++;
        start[255] = 0;
        for (int d = 254; d >= 0; d--) start[d] = start[d + 1] + count[d + 1];
        for (int i = 0; i < n; i++) tmp[start[(float_bits(a[i]) >> shift) & 255]++] = a[i];
        float *t = a;
        a = tmp, tmp = t;
    }
    /* four passes: the result is back in the caller's a */
}

int sampler_run(const struct sample_row *p, float *l, int V, float *scratch) {
    if (p->allow)
        for (int i = 0; i < V; i++)
            if (!(p->allow[i / 32] >> (i % 32) & 1)) l[i] = -INFINITY;
    for (int i = 0; i < p->n_bias; i++) l[p->bias_ids[i]] += p->bias_vals[i];
    for (int i = 0; i < p->n_mask; i++) l[p->mask_ids[i]] = -INFINITY;
    float rp = p->repetition_penalty;
    bool rep = rp != 1.0f && rp > 0.0f, pen = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    for (int i = 0; i < p->n_seen; i++) {
        const struct sample_seen *e = &p->seen[i];
        float *x = &l[e->id];
        /* HF/vLLM repetition penalty over prompt and output tokens */
        if (rep && (e->in_prompt || e->count > 0)) *x = *x > 0 ? *x / rp : *x * rp;
        /* OpenAI presence / frequency penalties over output tokens */
        if (pen && e->count > 0) *x -= p->frequency_penalty * (float)e->count + p->presence_penalty;
    }
    /* temperatures this small are greedy (vLLM's epsilon); dividing by them overflows */
    if (!(p->temperature >= 1e-5f)) return sampler_argmax(l, V);

    for (int i = 0; i < V; i++) l[i] /= p->temperature;
    /* top-k: keep logits >= the k-th largest */
    if (p->top_k > 0 && p->top_k < V) {
        memcpy(scratch, l, sizeof(float) * V);
        float kth = kth_largest(scratch, V, p->top_k);
        for (int i = 0; i < V; i++)
            if (l[i] < kth) l[i] = -INFINITY;
    }
    /* softmax */
    float *pr = scratch, *sorted = scratch + V, *tmp = scratch + 2 * (size_t)V;
    float mx = l[sampler_argmax(l, V)];
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        pr[i] = isinf(l[i]) && l[i] < 0 ? 0.0f : expf(l[i] - mx);
        sum += pr[i];
    }
    if (!(sum > 0.0) || !isfinite(sum)) return sampler_argmax(l, V); /* every token masked, or overflow */
    for (int i = 0; i < V; i++) pr[i] = (float)(pr[i] / sum);
    /* min-p: drop tokens below min_p * max prob */
    if (p->min_p > 0.0f) {
        float pmax = 0.0f;
        for (int i = 0; i < V; i++) pmax = pr[i] > pmax ? pr[i] : pmax;
        for (int i = 0; i < V; i++)
            if (pr[i] < p->min_p * pmax) pr[i] = 0.0f;
    }
    /* top-p: the smallest set of most likely tokens whose mass reaches top_p */
    if (p->top_p < 1.0f) {
        /* the kept (non-zero) probabilities, largest first: zeros would come last in the sorted
         * row and change neither sum, and the cut is reached by the last non-zero at the latest */
        int n = 0;
        for (int i = 0; i < V; i++)
            if (pr[i] > 0.0f) sorted[n++] = pr[i];
        sort_desc_positive(sorted, n, tmp);
        double tot = 0.0, acc = 0.0;
        for (int i = 0; i < n; i++) tot += sorted[i];
        float cut = n ? sorted[0] : 0.0f;
        for (int i = 0; i < n; i++) {
            acc += sorted[i];
            cut = sorted[i];
            if (acc >= p->top_p * tot) break;
        }
        for (int i = 0; i < V; i++)
            if (pr[i] < cut) pr[i] = 0.0f;
    }
    /* the draw: the first id whose cumulative mass, in id order, exceeds u * the total */
    double tot = 0.0;
    for (int i = 0; i < V; i++) tot += pr[i];
    double r = (double)p->u * tot, acc = 0.0;
    int last = -1;
    for (int i = 0; i < V; i++) {
        if (pr[i] <= 0.0f) continue;
        acc += pr[i];
        last = i;
        if (r < acc) return i;
    }
    return last >= 0 ? last : sampler_argmax(l, V);
}

int sampler_pick(struct sampler_seq *s, const struct engine_sampling *sp, float *l, int V, int n_generated,
                 const int32_t *mask, int n_mask, float *scratch) {
    struct sample_row p;
    sampler_row(&p, s, sp, n_generated, mask, n_mask);
    return sampler_run(&p, l, V, scratch);
}
