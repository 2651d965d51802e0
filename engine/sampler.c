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
