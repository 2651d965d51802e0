#include "engine/stats.h"

#include <string.h>

void engine_hist_init(struct engine_hist *h, const double *bounds, int n_bounds) {
    memset(h, 0, sizeof *h);
    h->n_bounds = n_bounds < ENGINE_HIST_MAX_BOUNDS ? n_bounds : ENGINE_HIST_MAX_BOUNDS;
    memcpy(h->bounds, bounds, sizeof(double) * h->n_bounds);
}

void engine_hist_observe(struct engine_hist *h, double v) {
    if (!(v >= 0)) v = 0;
    int b = 0;
    while (b < h->n_bounds && v > h->bounds[b]) b++;
    h->counts[b]++;
    h->sum += v;
    h->count++;
}
