/* metrics: the server's Prometheus counters and histograms and the text exposition of
 * GET /metrics: the server's own series, the engine's (engine_get_stats: gauges, counters,
 * vLLM's request and iteration histograms, cache_config_info) and the process_* series of
 * Prometheus client libraries (from /proc). Thread-safe: the observe functions may be called
 * from any HTTP thread; one mutex guards the histograms. */
#ifndef DUO_METRICS_H
#define DUO_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "engine/engine.h"

enum metrics_hist_id {
    METRICS_TTFT,        // time to first token (server side: arrival to first token out)
    METRICS_ITL,         // gap between consecutive tokens of one choice
    METRICS_E2E,         // arrival to last byte queued
    METRICS_N_HIST,
};

#define METRICS_N_STATUS 12

struct metrics {
    pthread_mutex_t mu;
    struct engine_hist hist[METRICS_N_HIST];
    uint64_t http_status[METRICS_N_STATUS]; // per status in metrics_statuses order
    uint64_t http_other;
};

void metrics_init(struct metrics *m);
void metrics_free(struct metrics *m);
void metrics_observe(struct metrics *m, enum metrics_hist_id h, double seconds);
void metrics_count_status(struct metrics *m, int status);

/* The Prometheus text (malloc'd). st may be NULL (engine not loaded yet). */
char *metrics_render(struct metrics *m, const struct engine_stats *st, const char *model_name);

#endif
