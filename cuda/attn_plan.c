/* attn_plan: see attn_plan.h. */
#include "cuda/attn_plan.h"

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

struct attn_plan attn_plan_make(const struct attn_plan_in *in) {
    struct attn_plan p = {.kernel = ATTN_K_CORE, .Z = 1};
    const int T = in->n_tokens, KV = in->n_kv_heads, G = KV > 0 ? in->n_heads / KV : 0;
    const bool flash = in->head_dim % 8 == 0 && in->head_dim <= 128 && G <= 16;
    /* A decode step of long contexts (split 4, 5) splits by the work: streaming (token, KV head)
     * pairs one unit each, the retrieval ones' partitions spread so that the step fills the blocks
     * the device holds at once (X units a retrieval KV head beyond one a token) */
    const int room = in->resident - in->n_stream * T; // blocks left for retrieval units
    p.X = in->n_full > 0 && room / in->n_full > T ? room / in->n_full - T : 0;
    p.counters = in->has_counters && (long)T * KV <= in->n_counters; // (a counter for each (token, KV head))
    p.work = flash && in->decode && in->split >= 4 && !in->plain_split && in->has_ws && in->has_part_off && p.counters &&
             (p.X > 0 || in->n_stream > 0);
    if (p.work)
        p.n_work = in->n_stream * T + in->n_full * (T + p.X);
    else if (flash && in->split && in->has_ws && in->has_part_off)
        p.Z = imax(1, imin(ATTN_MAX_SPLIT, (ATTN_SPLIT_FILL * in->sms + T * KV - 1) / (T * KV)));
    p.clus = p.Z > 1 && in->split >= 1 && in->split <= 3 && in->decode && in->cluster && in->head_dim > 32;
    /* The batch decode kernel: a work-sized split past CUDA_ATTN_MERGE_LONG partitions (split 5: its
     * resident blocks walk runs of partitions, the split pairs merged after it by
     * fa_merge_long_kernel), or an unsplit decode step of more units than the flash kernel's
     * resident blocks (plain units: one a (token, KV head), never split) */
    const bool bwork = p.work && in->split >= 5 && in->batch_takes;
    const bool batch = bwork || (flash && in->decode && p.Z == 1 && in->batch_takes && (long)T * KV > in->resident);
    if (p.clus) p.Z = 1 << in->split;
    p.unit_T = p.work && (bwork || !batch) ? T : 0;
    if (batch) {
        p.kernel = ATTN_K_BATCH;
        p.long_merges = bwork && in->n_full > 0 ? T : 0;
    } else if (flash && !in->decode && in->wg_takes) {
        p.kernel = ATTN_K_WG_PREFILL;
    } else if (flash) {
        p.kernel = ATTN_K_FLASH;
        p.merge_kernel = p.Z > 1 && !p.counters && !p.clus;
        /* split 5: only tokens given more than one unit split, at most X of them a retrieval KV head */
        p.long_merges = p.work && in->split >= 5 && p.X > 0 ? imin(T, p.X) : 0;
    }
    /* a decode step's RoPE and append inside the flash kernel (its COOP form: head dims 64 and
     * 128; a split step needs the in-kernel merge, whose block writes the rotated Q back) */
    p.rope_fused = in->rope && p.kernel == ATTN_K_FLASH && in->decode && (in->head_dim == 64 || in->head_dim == 128) &&
                   (p.Z == 1 || p.counters || p.clus);
    return p;
}
