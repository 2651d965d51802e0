/* tp: the ranks of tensor parallelism in one process. Rank r has its own backend (GPU r on
 * CUDA; a CPU reference backend otherwise), its own communicator (NCCL on CUDA, the thread
 * implementation of engine/comm.h on the CPU) and its own thread: rank 0 runs on the caller's
 * thread (the engine thread), ranks 1..n-1 on worker threads that tp_run wakes for each job.
 *
 * Why threads and not a process per GPU: the scheduler, the KV bookkeeping and the batch
 * metadata live in the engine thread's memory, and every rank reads the same fwd_batch by
 * pointer, so a step costs one wake-up per rank instead of a serialisation and an IPC message;
 * one process also means one set of NCCL communicators made by ncclCommInitAll (no unique-id
 * exchange), one PID for signals, health and exit status, and a failure on any rank is seen by
 * the scheduler at once (a crashed rank takes the whole server down rather than leaving it half
 * alive). What a process per GPU would buy (isolation of a driver crash, several hosts) does
 * not apply to one host's GPUs.
 *
 * The group is created and used by one thread (the engine thread); the workers only run jobs. */
#ifndef DUO_TP_H
#define DUO_TP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/model_config.h"

struct tp_group;

/* Whether a model can be split over n ranks: its attention heads, KV heads and MLP width must
 * divide by n. Returns 0, or -1 with a one-line message. */
int tp_check(const struct model_config *c, int n, char *err, size_t errlen);

/* The KV heads each rank holds, balanced for DuoAttention: heads[(l * n + r) * kvr + j] (kvr =
 * n_kv_heads / n) is the checkpoint KV head at place j of rank r in layer l; a rank's retrieval
 * heads come first (they live in the full pool), then its streaming ones, each in checkpoint
 * order. In each layer every rank gets the same number of retrieval heads, and the remainder
 * (retrieval heads % n) goes one each to the ranks with the fewest retrieval heads in earlier
 * layers (ties: the lower rank); so per layer and over the whole model, the ranks' retrieval
 * heads (their full-pool bytes and attention work) differ by at most one head. Heads are then
 * dealt in checkpoint order: rank 0 takes the first of its share of retrieval heads, rank 1 the
 * next, and the streaming heads likewise, so without streaming heads rank r holds the
 * contiguous heads [r * kvr, (r + 1) * kvr) (Megatron's split), and with n = 1 the order is the
 * single-GPU order. streaming: [n_layers][n_kv_heads] (non-zero: streaming) or NULL (none).
 * n_full (optional): [n_layers][n] the retrieval heads of each rank. Returns 0, or -1 out of
 * memory. */
int tp_assign_heads(int n_layers, int n_kv_heads, int n, const uint8_t *streaming, int *heads, int *n_full);

/* n ranks; b0 (borrowed) is rank 0's backend, the others are made like it (cuda_flags: their
 * BACKEND_CUDA_* flags). Returns 0, or -1 with a one-line message (too few GPUs, no NCCL, ...). */
int tp_group_create(struct tp_group **out, struct backend *b0, int n, int cuda_flags, char *err, size_t errlen);
/* Stops the workers and destroys what the group made (not b0); NULL is a no-op. */
void tp_group_free(struct tp_group *g);

int tp_size(const struct tp_group *g);
struct backend *tp_backend(const struct tp_group *g, int rank);
struct comm *tp_comm(const struct tp_group *g, int rank);

/* Runs fn(arg, r) on every rank r at once (rank 0 on this thread) and waits for all of them.
 * Returns the first non-zero result in rank order, or 0. A rank whose job fails must abort its
 * communicator before returning, so that no peer waits for it. */
int tp_run(struct tp_group *g, int (*fn)(void *arg, int rank), void *arg);

/* Test hook (fault injection): true on the k-th call from the last rank when the environment
 * has DUOSERVE_TP_FAULT_STEP=k, so that tests can make one rank fail mid-run. */
bool tp_fault(struct tp_group *g, int rank);

#endif
