/* duo_pattern: DuoAttention head patterns. Reads the learned gates of
 * `full_attention_heads.tsv` (rows = layers, tab-separated gates per KV head) and turns them
 * into a per-(layer, KV head) choice: retrieval head (full KV cache) or streaming head (only
 * `sink` first and `recent` last tokens). With sparsity s, heads whose gate is below the
 * s-quantile of all gates (numpy's default linear interpolation) become streaming heads. */
#ifndef DUO_DUO_PATTERN_H
#define DUO_DUO_PATTERN_H

#include <stddef.h>
#include <stdint.h>

struct duo_pattern {
    int n_layers, n_kv_heads;
    float *gates; // [n_layers][n_kv_heads]
};

int duo_pattern_load(struct duo_pattern *p, const char *path, char *err, size_t errlen);
int duo_pattern_parse(struct duo_pattern *p, const char *text, char *err, size_t errlen);
void duo_pattern_free(struct duo_pattern *p);

/* numpy.quantile(gates, q) with linear interpolation. */
float duo_pattern_quantile(const struct duo_pattern *p, float q);

/* is_streaming[l * n_kv_heads + h] = 1 for streaming heads at sparsity s in [0, 1]. Returns
 * the number of streaming heads. */
int duo_pattern_streaming(const struct duo_pattern *p, float sparsity, uint8_t *is_streaming);

#endif
