/* sched: the continuous-batching scheduler. It keeps the waiting and running sequences and plans
 * each step: running sequences first (decodes and unfinished prefill chunks, oldest first), then
 * waiting ones FCFS, within the step's token budget and the seats (max_num_seqs); preemption by
 * recompute (the newest running sequence loses its KV and waits at the front) when the full pool
 * has no room. It asks the KV cache for room (engine/kv_cache.h: NO_SPACE is an answer, copy on
 * write is the cache's business) and never reads the cache's fields.
 *
 * A sequence (struct sched_seq) is embedded in its owner's object (the core's choice); the owner
 * keeps n_tokens up to date as tokens are appended, and advances n_computed after a step.
 * Prefix caching (when the cache has it on): a sequence admitted with nothing computed starts from the
 * longest prefix of its tokens the cache holds (n_cached of them), and a sequence that leaves or is
 * preempted leaves its KV behind for others (kv_cache_seq_retire).
 * Forks: a sequence admitted with forks_pending > 0 reserves that many more seats (and slots);
 * the forks join running with sched_fork once the parent's prompt is computed.
 * Step cost: a running sequence with one token left (a decode) always gets its token before any
 * prefill chunk takes the token budget. While sequences decode, prefill chunks are also sized by
 * their cost (struct sched_cost: the linear layers per token plus attention per visible key, which
 * grows with the chunk's prefix), so that the step stays within cost.step_budget and the decodes'
 * inter-token latency stays bounded however long the prompt beside them; the oldest prefill still
 * gets at least cost.min_chunk tokens a step. On a GPU the retrieval heads' attention of a chunk
 * costs by the waves of kernel blocks it fills (struct sched_waves), and chunks end at a wave's
 * end. With nothing decoding, chunks take the whole token budget. Engine thread only. */
#ifndef DUO_SCHED_H
#define DUO_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kv_cache.h"

enum sched_state { SCHED_NEW = 0, SCHED_WAITING, SCHED_RUNNING, SCHED_DONE };

struct sched_seq {
    enum sched_state state;
    int n_tokens;      // tokens of the sequence (prompt and generated)
    int n_computed;    // tokens whose K/V are in the pools
    int forks_pending; // seats held for choices still to fork from this one
    const int32_t *tokens; // [n_tokens] (the owner's array), for prefix caching
    int n_cached;      // prompt tokens the prefix cache gave at its first admission
    int snapshot_at;   // tokens computed at which the prefix cache keeps a snapshot (its prompt's end); 0: none
    uint64_t admit_order;
    double t_scheduled; // first admission (kept across preemptions); 0 before
    struct kv_seq kv;
};

/* A step's cost model, in token-equivalents (the linear layers' work for one token = 1): a query at
 * position p costs 1 + sum over attn[k] of per_key * min(p + 1, window) (window 0: p + 1, every
 * earlier key). The caller derives the numbers from the model (engine/core_create.c); the
 * scheduler knows no model, only the heads' blocks of the wave model below. */
struct sched_attn_cost {
    double per_key; // cost of one query against one visible key, for these heads (their share included)
    int window;     // keys a query of these heads sees at most; 0: all earlier keys
};

/* The wave model of a GPU's prefill attention (backend_ops.prefill_blocks): a chunk's retrieval
 * heads run in blocks of block_tokens query tokens of one KV head, `wave` blocks at once, each
 * walking every key its rows see, so a wave takes about as long full as not. A part (a layer)
 * with `heads` retrieval KV heads runs ceil(n / block_tokens) x heads blocks for a chunk of n
 * tokens; the chunk is charged the keys of the tokens whose blocks would fill the waves those
 * start (sched_blocks_span). */
struct sched_wave_part {
    double per_key; // the part's share of attn[0].per_key
    int heads;      // retrieval KV heads (the busiest rank's under tensor parallelism)
};

struct sched_waves {
    int wave;         // blocks that run at once; 0: no wave model
    int block_tokens; // query tokens of one KV head a block takes
    int n_parts;
    const struct sched_wave_part *parts; // [n_parts], borrowed: it outlives the scheduler
};

struct sched_cost {
    struct sched_attn_cost attn[2]; // e.g. retrieval heads (window 0) and streaming heads (sink + recent)
    struct sched_waves waves;       // when set, a chunk's attn[0] heads cost by their waves (with attn[0]'s
                                    // window); a decode keeps attn[0]
    double step_budget;             // cap on a step's cost while sequences decode; <= 0: no cap
    int min_chunk;                  // fewest tokens the cap leaves the oldest prefill a step (0: 1)
};

struct sched_config {
    int max_num_seqs;     // seats: running sequences, forks reserved included
    int max_batch_tokens; // tokens a step computes at most
    struct sched_cost cost; // all zero: chunks by the token budget alone
};

struct sched_list {
    struct sched_seq **v;
    int n, cap;
};

/* One step's work: seqs[i] computes want[i] tokens from its n_computed on. */
struct sched_plan {
    struct sched_seq **seqs; // [max_num_seqs]
    int *want;
    int n, n_tokens;
};

struct sched {
    struct sched_config cfg;
    struct kv_cache *kv;
    bool has_stream;      // sequences need a streaming slot
    struct sched_list waiting, running; // running in admission order
    int reserved;         // seats and slots held for forks of running parents
    uint64_t next_admit;
    uint64_t preemptions;
    struct sched_plan plan;
};

int sched_init(struct sched *s, const struct sched_config *cfg, struct kv_cache *kv);
void sched_free(struct sched *s);

/* q (state NEW, its KV empty) joins the waiting queue's tail. -1 when out of memory. */
int sched_add(struct sched *s, struct sched_seq *q);
/* Plans the next step (admitting and preempting as needed); the plan lives in s->plan until the
 * next call. Returns the number of sequences in it (0: nothing to do). */
int sched_step_plan(struct sched *s);
/* After the planned step ran: each planned sequence computed its tokens (its full blocks join the
 * prefix cache). */
void sched_step_done(struct sched *s);
/* After the planned step failed: the planned sequences' KV past what they had computed may be
 * half written, so none of it is kept as a prefix snapshot when they leave. */
void sched_step_failed(struct sched *s);
/* q leaves the scheduler (finished or aborted, from any state): its KV goes back to the cache and
 * the seats it held for forks are given back. */
void sched_finish(struct sched *s, struct sched_seq *q);
/* child (state NEW) starts running as a copy of parent (running, forks_pending > 0): it shares the
 * parent's blocks, gets a copy of its slot, takes one of the parent's reserved seats. */
enum kv_status sched_fork(struct sched *s, struct sched_seq *parent, struct sched_seq *child);

/* The cost of computing tokens [start, start + n) of one sequence (its chunk), under c; it never
 * falls as n grows. */
double sched_chunk_cost(const struct sched_cost *c, int start, int n);
/* The cost of a decode (one token) at position pos: attn[0] and attn[1], the wave model aside. */
double sched_decode_cost(const struct sched_cost *c, int pos);
/* The tokens (>= n) whose blocks would fill the waves that a chunk of n tokens starts in a part of
 * `heads` retrieval KV heads: floor(waves x wave / heads) x block_tokens, for waves =
 * ceil(ceil(n / block_tokens) x heads / wave). n itself without a wave model or heads. */
int sched_blocks_span(const struct sched_waves *w, int heads, int n);
/* The least chunk worth a step with the wave model: one wave of the part with the most heads, in
 * whole blocks of block_size tokens (KV blocks), at least block_size (a smaller chunk takes about
 * as long). block_size without a wave model or heads. */
int sched_wave_chunk(const struct sched_waves *w, int block_size);
/* The most tokens (<= max_n) a chunk from start can take within cost; 0 when not even one fits. */
int sched_chunk_fit(const struct sched_cost *c, int start, int max_n, double cost);
/* The tokens of a prefill chunk from start within cost, at most max_n: the fit, except that with
 * the wave model a fit short of max_n that fills less than half of the last wave it starts (in
 * the part with the most heads) ends at the end of the wave before, when that leaves at least
 * min_chunk; `first` (the step's first chunk: progress) gets at least min_chunk (or max_n). */
int sched_chunk_size(const struct sched_cost *c, int start, int max_n, double cost, bool first);

bool sched_has_work(const struct sched *s);
int sched_num_running(const struct sched *s);
int sched_num_waiting(const struct sched *s);
/* A sequence still in the scheduler (running first), or NULL: for aborting everything. */
struct sched_seq *sched_any(const struct sched *s);
/* The waiting sequences no free seat can take (FCFS: every one from the first that does not fit),
 * and the seats left after those that fit. */
void sched_queue_state(const struct sched *s, int *unseated, int *seats_left);

#endif
