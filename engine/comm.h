/* comm: the collectives tensor parallelism needs, beside the backend table (engine/backend.h).
 * A communicator joins n ranks; rank r's calls come from rank r's thread, and every rank makes
 * the same calls in the same order (a collective returns once its data is in place, or, on a
 * device, once it is queued on the rank's stream). Buffers are backend memory of the rank.
 * Two implementations:
 * - threads (comm_threads_create): ranks are threads of this process over host memory, for the
 *   CPU backend. Deterministic: every element of a sum is added in rank order 0, 1, ..., n-1
 *   (in f32), so every rank gets the same bits whatever the threads' timing.
 * - NCCL (comm_nccl_create, cuda/comm_nccl.cu): one GPU per rank, queued on the rank's stream.
 * A failure must never leave a rank waiting for a peer: abort() on any rank makes every pending
 * and later collective of every rank of the group return COMM_ERR_ABORTED. */
#ifndef DUO_COMM_H
#define DUO_COMM_H

#include <stdbool.h>
#include <stddef.h>

struct backend;

enum comm_dtype { COMM_F32, COMM_BF16 };
enum comm_status { COMM_OK = 0, COMM_ERR_ABORTED = -1, COMM_ERR_DEVICE = -2, COMM_ERR_OOM = -3 };

struct comm;

struct comm_ops {
    /* buf[n] = the element-wise sum of every rank's buf[n], in place */
    int (*all_reduce_sum)(struct comm *c, void *buf, size_t n, enum comm_dtype dt);
    /* dst[rank * n + i] = rank's src[i] for every rank (dst holds size * n elements) */
    int (*all_gather)(struct comm *c, void *dst, const void *src, size_t n, enum comm_dtype dt);
    /* callable from any thread, also while peers wait in a collective */
    void (*abort)(struct comm *c);
    /* true once the group was aborted (by any rank) */
    bool (*aborted)(struct comm *c);
    void (*destroy)(struct comm *c);
};

struct comm {
    const struct comm_ops *ops;
    int rank, size;
    void *ctx;
};

/* n communicators of one group of n threads: out[r] is rank r's. Returns 0 or COMM_ERR_OOM. */
int comm_threads_create(struct comm **out, int n);
/* n NCCL communicators, one per CUDA backend b[r] (a GPU each), on the backends' streams.
 * NCCL is loaded at run time (libnccl.so.2), so a single-GPU server does not need it. Returns 0,
 * or -1 with a one-line message (no CUDA in this build, NCCL missing, initialisation failed). */
int comm_nccl_create(struct comm **out, struct backend *const *b, int n, char *err, size_t errlen);
void comm_destroy(struct comm *c); // NULL is a no-op

#endif
