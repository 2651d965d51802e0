/* model_impl: what model_tp.c (the model the engine holds: its ranks together) calls in model.c
 * (one rank: loading its shard, its step); calls run only that way. No other module includes it. */
#ifndef DUO_MODEL_IMPL_H
#define DUO_MODEL_IMPL_H

#include "engine/model.h"

/* Which shard a rank loads. */
struct model_rank_spec {
    int rank, size;    // its KV heads are tp_assign_heads' choice for it
    struct comm *comm; // NULL with one rank
    bool progress;     // this rank logs the loading progress
};

/* Loads one rank's shard into b. On error -1 with a message. */
int model_load_rank(struct model **out, const char *dir, struct backend *b, const struct model_load_opts *o,
                    const struct model_rank_spec *spec, char *err, size_t errlen);
/* Frees one rank's model (not the other ranks it may own). */
void model_free_rank(struct model *m);
/* One rank's step: begin_step, the ops (graph replay or capture), wait, sync. Rank 0 delivers the
 * logits / argmax ids; the others only take part in the collectives. */
int model_step(struct model *m, struct kv_cache *kv, const struct fwd_batch *batch, float *logits);

#endif
