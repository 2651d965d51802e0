/* The attention kernel's choice and split (cuda/attn_plan.c), the rules that tie a split to the
 * merge of its states, on every shape of a sweep: a kernel that splits a (token, KV head) into
 * units (unit_T) is one that merges them (the flash kernel: in the kernel or by the long merges;
 * the batch decode kernel: only by the long merges, so only at split 5); the batch kernel's plain
 * steps are its many-unit ones; the plain split is always merged (a cluster, the counters, or
 * fa_merge_kernel). And the step that broke the first rule (run 80: 48 one-token sequences at a
 * 3,000-token context with streaming heads, split 4, ran split in the batch kernel, unmerged). */
#include <stdbool.h>

#include "tests/test_common.h"

#include "cuda/attn_plan.h"

/* Llama-3-8B's layer (32 heads, 8 KV, head dim 128) under a duo pattern of 3 streaming KV heads,
 * on an H200's resident blocks (2 an SM of 132) */
static struct attn_plan_in llama_step(int T, int split) {
    struct attn_plan_in in = {.n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .n_full = 5, .n_stream = 3,
                              .n_tokens = T, .decode = true, .split = split, .has_ws = true, .has_part_off = true,
                              .has_counters = true, .n_counters = 8192, .resident = 264, .sms = 132, .cluster = true,
                              .batch_takes = true, .wg_takes = true, .rope = true};
    return in;
}

static void test_many_units_at_split4_run_plain(void **state) {
    (void)state;
    struct attn_plan_in in = llama_step(48, 4);
    struct attn_plan p = attn_plan_make(&in);
    assert_true(p.work); /* (the flash kernel would split it by the work: streaming heads) */
    assert_int_equal(p.kernel, ATTN_K_BATCH);
    assert_int_equal(p.unit_T, 0);
    assert_int_equal(p.long_merges, 0);
    /* past CUDA_ATTN_MERGE_LONG partitions the batch kernel splits, and every token is merged */
    in.split = 5;
    p = attn_plan_make(&in);
    assert_int_equal(p.kernel, ATTN_K_BATCH);
    assert_int_equal(p.unit_T, 48);
    assert_int_equal(p.long_merges, 48);
    /* a few long sequences: the flash kernel's work-sized split, merged in the kernel (split 4) */
    in = llama_step(2, 4);
    p = attn_plan_make(&in);
    assert_int_equal(p.kernel, ATTN_K_FLASH);
    assert_int_equal(p.unit_T, 2);
    assert_true(p.counters);
    assert_int_equal(p.long_merges, 0);
}

static void test_short_steps(void **state) {
    (void)state;
    struct attn_plan_in in = llama_step(1, 2); /* one token within 4 partitions: a cluster of 4 */
    struct attn_plan p = attn_plan_make(&in);
    assert_int_equal(p.kernel, ATTN_K_FLASH);
    assert_true(p.clus);
    assert_int_equal(p.Z, 4);
    assert_true(p.rope_fused);
    in = llama_step(256, 0); /* b256 at a short context: the batch kernel, RoPE before it */
    p = attn_plan_make(&in);
    assert_int_equal(p.kernel, ATTN_K_BATCH);
    assert_int_equal(p.unit_T, 0);
    assert_false(p.rope_fused);
    in = llama_step(2048, 0); /* a prefill chunk */
    in.decode = false;
    p = attn_plan_make(&in);
    assert_int_equal(p.kernel, ATTN_K_WG_PREFILL);
    in.wg_takes = false;
    assert_int_equal(attn_plan_make(&in).kernel, ATTN_K_FLASH);
    in.head_dim = 256, in.n_heads = 8, in.n_kv_heads = 1, in.n_full = 1, in.n_stream = 0; /* no tensor-core form */
    assert_int_equal(attn_plan_make(&in).kernel, ATTN_K_CORE);
}

static int n_checked;

static void check_rules(const struct attn_plan_in *in) {
    const struct attn_plan p = attn_plan_make(in);
    const int T = in->n_tokens, KV = in->n_kv_heads, G = in->n_heads / KV;
    const bool flash = in->head_dim % 8 == 0 && in->head_dim <= 128 && G <= 16;
    char what[256];
    snprintf(what, sizeof what, "H%d KV%d hd%d stream %d, T %d, decode %d split %d, resident %d, plain %d, counters %d/%d, batch %d",
             in->n_heads, KV, in->head_dim, in->n_stream, T, in->decode, in->split, in->resident, in->plain_split,
             in->has_counters, in->n_counters, in->batch_takes);
    bool ok = true;
#define RULE(c)                                                                                                        \
    if (!(c)) {                                                                                                        \
        fprintf(stderr, "rule %s broken: %s\n", #c, what);                                                             \
        ok = false;                                                                                                    \
    }
    RULE(p.unit_T == 0 || (p.unit_T == T && p.work));
    RULE(p.long_merges == 0 || p.unit_T > 0); /* merges only for a split by the work */
    RULE(!flash ? p.kernel == ATTN_K_CORE : p.kernel != ATTN_K_CORE);
    RULE(in->batch_takes || p.kernel != ATTN_K_BATCH);
    RULE(in->decode ? p.kernel != ATTN_K_WG_PREFILL : p.kernel != ATTN_K_BATCH);
    if (p.kernel == ATTN_K_BATCH && p.unit_T > 0) { /* its split pairs: merged by the long merges alone */
        RULE(in->split >= 5);
        RULE(p.long_merges == (in->n_full > 0 ? T : 0));
    }
    if (p.kernel == ATTN_K_BATCH && p.unit_T == 0) { /* plain units: one a (token, KV head) */
        RULE(p.Z == 1 && p.long_merges == 0);
        RULE((long)T * KV > in->resident);
    }
    if (p.kernel == ATTN_K_FLASH) RULE(p.work == (p.unit_T > 0)); /* its grid is the units exactly when it splits by them */
    if (p.kernel == ATTN_K_FLASH && p.unit_T > 0) { /* in the kernel (counters), and past split 5 the long merges */
        RULE(p.counters);
        RULE(p.n_work == in->n_stream * T + in->n_full * (T + p.X) && p.n_work >= 1);
        RULE(p.long_merges == (in->split >= 5 && p.X > 0 ? (T < p.X ? T : p.X) : 0));
    }
    if (p.kernel == ATTN_K_FLASH && p.Z > 1) RULE(p.clus + p.counters + p.merge_kernel >= 1 && !p.work);
    RULE(p.Z >= 1 && p.Z <= ATTN_MAX_SPLIT);
    RULE(!p.clus || (p.Z == 1 << in->split && in->split >= 1 && in->split <= 3 && in->decode && in->cluster &&
                     in->head_dim > 32));
    RULE(!p.counters || (in->has_counters && (long)T * KV <= in->n_counters)); /* a counter for each pair */
    RULE(!p.work || (in->has_ws && in->has_part_off && !in->plain_split));
    RULE(!p.merge_kernel || (p.kernel == ATTN_K_FLASH && p.Z > 1));
    RULE(!p.rope_fused || (p.kernel == ATTN_K_FLASH && in->decode && in->rope && (in->head_dim == 64 || in->head_dim == 128)));
    RULE(!p.rope_fused || p.Z == 1 || p.counters || p.clus); /* a split step: the merging block writes the rotated Q */
    if (p.kernel != ATTN_K_FLASH) RULE(p.unit_T == 0 || p.kernel == ATTN_K_BATCH);
#undef RULE
    n_checked++;
    assert_true(ok);
}

static void test_rules_on_a_sweep(void **state) {
    (void)state;
    static const int shapes[][3] = {{32, 8, 128}, {32, 4, 128}, {16, 4, 64}, {32, 2, 128}, {8, 1, 64},
                                    {8, 2, 16},   {32, 8, 32},  {32, 1, 128}, {14, 2, 64}, {8, 1, 256}};
    static const int tokens[] = {1, 2, 3, 7, 16, 33, 48, 100, 150, 400, 2048};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 4; k++) { /* streaming KV heads: none, one, half, all */
            const int KV = shapes[s][1], ns = k == 0 ? 0 : k == 1 ? 1 : k == 2 ? KV / 2 : KV;
            if (k > 0 && ns == (k == 1 ? 0 : k == 2 ? 1 : KV / 2)) continue; /* (the same as the one before) */
            for (size_t t = 0; t < sizeof tokens / sizeof tokens[0]; t++)
                for (int split = 0; split <= 5; split++)
                    for (int v = 0; v < 1024; v++) {
                        struct attn_plan_in in = {
                            .n_heads = shapes[s][0], .n_kv_heads = shapes[s][1], .head_dim = shapes[s][2],
                            .n_full = shapes[s][1] - ns, .n_stream = ns, .n_tokens = tokens[t],
                            .decode = !(v & 1), .split = split, .has_ws = !(v & 256), .has_part_off = !(v & 512),
                            .has_counters = !(v & 2), .resident = v & 4 ? 528 : 264, .sms = 132,
                            .cluster = !(v & 8), .plain_split = v & 16, .batch_takes = !(v & 32),
                            .wg_takes = !(v & 64), .rope = !(v & 128)};
                        /* counters: none, one short of the step's pairs, or plenty */
                        in.n_counters = v & 2 ? 0 : ((v >> 3 ^ v >> 7) & 1 ? tokens[t] * shapes[s][1] - 1 : 8192);
                        check_rules(&in);
                    }
        }
    assert_true(n_checked > 1000000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_units_at_split4_run_plain),
        cmocka_unit_test(test_short_steps),
        cmocka_unit_test(test_rules_on_a_sweep),
    };
    return cmocka_run_group_tests_name("attn_plan", tests, NULL, NULL);
}
