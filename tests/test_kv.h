/* Test helper: the KV pools hold nothing for a sequence (every block and slot is free, or held by
 * the prefix cache alone, which gives it back on demand). */
#ifndef DUO_TEST_KV_H
#define DUO_TEST_KV_H

#include "engine/kv_cache.h"

static inline void assert_kv_idle(const struct kv_cache *kv) {
    struct kv_cache_usage u;
    kv_cache_usage(kv, &u);
    assert_int_equal(u.n_free_blocks, u.n_blocks);
    assert_int_equal(u.n_free_slots, u.n_slots);
}

#endif
