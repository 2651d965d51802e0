// cuda_ctx.h: the CUDA backend's context (cuda/backend_cuda.cu), shared with its step graphs and
// op timing (cuda/backend_cuda_graph.cu). Private to those two files.
#ifndef DUO_CUDA_CTX_H
#define DUO_CUDA_CTX_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "engine/backend.h"
#include "engine/elog.h"
}
#include "cuda/cuda_attention.h"
#include "cuda/cuda_gemm.h"
#include "cuda/cuda_tuning.h"

#define CUDA_MAX_GRAPHS 512 /* decode batch sizes that get a graph */

/* DUOSERVE_OP_TIMING=1 (cuda_tuning): the GPU time of each op of every forward pass, from CUDA
 * events recorded after each op (captured into decode graphs as event nodes, so replays are timed
 * too); each op's share is the time from the previous event to its own, launch gaps included. A
 * table goes to the log when the backend is destroyed. Off by default. */
#define TM_MAX_EV 2048
#define TM_MAX_LABELS 96
struct op_timing {
    cudaEvent_t ev[TM_MAX_EV]; // ev[0]: the step's start (begin_step)
    int label[TM_MAX_EV];      // the op that ended at ev[i]
    int n;                     // events of the step in flight
    char *names[TM_MAX_LABELS];
    int n_names;
    double ms[TM_MAX_LABELS];
    long calls[TM_MAX_LABELS];
    long steps, dropped;
    bool capturing;
    bool dirty; // this step captured a graph or grew a buffer: host time between its events
};

struct meta_caps {
    size_t T, S, B; /* capacities of the segments of d_meta */
};

#define ATTN_COUNTERS 65536 // (token, KV head) pairs of a split step merged in the flash kernel

struct cuda_ctx {
    int device;
    struct cuda_tuning tune; // the tuning switches, read once at creation
    struct cuda_gemm gemm;   // the GEMMs' split-K workspace on this device
    struct cuda_attn_env attn_env;
    cudaStream_t stream;
    cublasHandle_t blas;
    int err; // first error of a void op (backend_status)
    // batch metadata: one device buffer, one pinned staging buffer
    int32_t *d_meta, *h_meta;
    size_t meta_cap;
    struct meta_caps caps;
    const int32_t *tokens, *pos, *tok_seq, *seq_start, *indptr, *blocks, *slots, *rows, *part_off;
    int32_t *pf_list; // the wgmma prefill kernel's block list (after the blocks; device only)
    float *attn_ws; // split-decode partition states (cuda/attention.cu)
    int *attn_counters; // the split blocks done per (token, KV head) and the long merges' list, after the states
    bool decode_step;  // this step: every sequence one token
    // and one of them past the first partition: 0 no; 1, 2, 3 every token within 2, 4, 8
    // partitions (merged in a thread-block cluster of that many blocks when the step splits);
    // 4 longer (merged through global memory), 5 some token past CUDA_ATTN_MERGE_LONG partitions
    // (a work-sized split merges those in a kernel of its own). Decode graphs are kept apart by it.
#define SPLIT_MODES 6
    int split_decode;
    size_t attn_ws_floats;
    size_t attn_part_floats; // the largest layer's partition states a token position (heads x (head dim + 2))
    size_t step_parts;       // this step's partitions (part_off's total)
    int n_tokens, n_seqs, n_logits;
    float *d_logits;
    size_t logits_cap;
    float *d_tmp; // f32 staging for upload/download of activations
    size_t tmp_cap;
    float *h_logits;       // pinned staging of the logits; copied out by sync()
    size_t h_logits_cap;
    float *pending_dst;    // where sync() delivers them
    int n_logit_rows;
    size_t pending_n;
    int32_t *d_ids, *h_ids;   // argmax ids (device, pinned), [logits rows]
    int32_t *d_amax_ws;       // the argmax kernel's workspace (in the d_ids allocation)
    int ids_rows;
    int32_t *pending_ids;     // where sync() delivers them
    int pending_n_ids;
    struct cuda_sampler *sampler; // the sample op's buffers (cuda/sampling.cu)
    // CUDA graphs of decode steps, by batch size (and whether the logits go to the host); all
    // invalid when a buffer they use moves
    // [ids only][split decode][batch size]
    cudaGraphExec_t graphs[2][SPLIT_MODES][CUDA_MAX_GRAPHS + 1];
    bool graphs_off; // DUOSERVE_NO_CUDA_GRAPHS=1, or a capture or replay failed
    struct op_timing *tm;             // DUOSERVE_OP_TIMING=1, else NULL
    int *graph_labels[2][SPLIT_MODES][CUDA_MAX_GRAPHS + 1]; // per graph: the labels of its event nodes
    int graph_n_ev[2][SPLIT_MODES][CUDA_MAX_GRAPHS + 1];
    uint16_t *stage;   // weight upload staging, [2][32 Mi] bf16
    bool stage_pinned;
    bool cublas; // BACKEND_CUDA_CUBLAS: cuBLAS GEMMs (faster at large batches, not batch-invariant)
    void *blas_ws;
};

#define CTX(b) ((struct cuda_ctx *)(b)->ctx)

/* Makes the backend's GPU current on the calling thread. Tensor parallelism calls a rank's
 * backend from the engine thread (allocation, KV copies, freeing) as well as from the rank's own
 * thread; the entry points that may be the first call on a thread set it (begin_step for a
 * step's ops, which follow on the same thread). */
static inline void use_device(const struct cuda_ctx *c) {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != c->device) cudaSetDevice(c->device);
}

// Records the first failure of a void op; file:line goes to the log.
#define CK(b, stmt)                                                                                       \
    do {                                                                                                  \
        cudaError_t e_ = (stmt);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            elog("error", "CUDA error %s in %s at %s:%d", cudaGetErrorString(e_), #stmt, __FILE__, __LINE__);  \
            if (!CTX(b)->err) CTX(b)->err = BACKEND_ERR_DEVICE;                                          \
        }                                                                                                 \
    } while (0)
#define CKI(b, rc)                                                                                        \
    do {                                                                                                  \
        if ((rc) != 0 && !CTX(b)->err) CTX(b)->err = BACKEND_ERR_DEVICE;                                  \
    } while (0)
#define CUBLAS_CHECK(b, stmt)                                                                             \
    do {                                                                                                  \
        cublasStatus_t s_ = (stmt);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                \
            elog("error", "cuBLAS error %d in %s at %s:%d", (int)s_, #stmt, __FILE__, __LINE__);             \
            if (!CTX(b)->err) CTX(b)->err = BACKEND_ERR_DEVICE;                                          \
        }                                                                                                 \
    } while (0)

/* cuda/backend_cuda_graph.cu */
void cuda_drop_graphs(struct cuda_ctx *c);
int cuda_graph_begin(struct backend *b, int key, float *host_logits, size_t n_floats, int32_t *host_ids);
int cuda_graph_end(struct backend *b, int key);
void tm_mark(struct cuda_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tm_collect(struct cuda_ctx *c);
void tm_open(struct cuda_ctx *c);
void tm_close(struct cuda_ctx *c);

#endif
