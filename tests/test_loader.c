/* Loading model directories: HF config.json variants (transformers 4.x and 5.x), safetensors
 * single and sharded, and every kind of malformed directory, which must give a one-line error
 * naming the file and the problem (never a crash). */
#include <cjson/cJSON.h>
#include <math.h>

#include "tests/test_common.h"

#include "engine/kv_cache_impl.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/util.h"

static int test_kv_init(struct kv_cache *kv, struct backend *b, const struct model *m, int bs, int n_blocks) {
    struct kv_geometry g;
    model_kv_geometry(m, bs, 0, 1, &g);
    return kv_cache_init(kv, b, &g, n_blocks, 1);
}

#define BASE "tests/fixtures/hf/qwen2"

/* A scratch copy of the qwen2 fixture model. */
static char *copy_base(void) {
    char *d = test_mkdtemp(), src[512], dst[512];
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(src, sizeof src, "%s/%s", BASE, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", d, files[i]);
        test_copy_file(src, dst, -1);
    }
    return d;
}

/* Loading dir must fail with a single-line message containing every given fragment. */
static void expect_load_error(const char *dir, const char *frag1, const char *frag2) {
    struct backend *b = backend_cpu_create();
    struct model *m = NULL;
    char err[1024] = "";
    int rc = model_load(&m, dir, b, 16, err, sizeof err);
    print_message("  error: %s\n", err);
    assert_int_equal(rc, -1);
    assert_null(m);
    assert_null(strchr(err, '\n'));
    if (frag1) assert_non_null(strstr(err, frag1));
    if (frag2) assert_non_null(strstr(err, frag2));
    backend_destroy(b);
}

static void patch_config(const char *dir, const char *key, cJSON *value) {
    char path[512], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(util_read_file(path, &text, &len), 0);
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (value) cJSON_ReplaceItemInObject(j, key, value);
    else cJSON_DeleteItemFromObject(j, key);
    char *out = cJSON_Print(j);
    test_write_text(path, out);
    free(out);
    cJSON_Delete(j);
}

static void test_missing_directory_names_config_json(void **state) {
    expect_load_error("/nonexistent/model-dir", "model directory not found: /nonexistent/model-dir", NULL);
    char *d = test_mkdtemp(), p[512];
    snprintf(p, sizeof p, "%s/config.json not found", d);
    expect_load_error(d, p, "is not a Hugging Face model directory");
    snprintf(p, sizeof p, "%s/config.json", d);
    test_write_text(p, "{}");
    expect_load_error(p, "is not a directory", NULL);
    test_rm_rf(d);
    free(d);
}

static void test_config_not_json_is_rejected(void **state) {
    char *d = copy_base(), p[512];
    snprintf(p, sizeof p, "%s/config.json", d);
    test_write_text(p, "{\"architectures\": [\"Qwen2ForCausalLM\"], ");
    expect_load_error(d, "config.json", "not a JSON object");
    test_rm_rf(d);
    free(d);
}

static void test_unknown_architecture_is_rejected(void **state) {
    char *d = copy_base();
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_CreateString("GPT2LMHeadModel"));
    patch_config(d, "architectures", a);
    expect_load_error(d, "config.json", "unsupported architecture \"GPT2LMHeadModel\"");
    test_rm_rf(d);
    free(d);
}

static void test_missing_safetensors_is_rejected(void **state) {
    char *d = copy_base(), p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    unlink(p);
    expect_load_error(d, d, "no model.safetensors or model.safetensors.index.json");
    test_rm_rf(d);
    free(d);
}

static void test_truncated_safetensors_is_rejected_at_every_cut(void **state) {
    char src[512];
    snprintf(src, sizeof src, "%s/model.safetensors", BASE);
    struct stat st;
    assert_int_equal(stat(src, &st), 0);
    /* no length, half a length, inside the header, inside the data, one byte short */
    long cuts[] = {0, 4, 8, 60, 300, st.st_size / 2, st.st_size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char *d = copy_base(), p[512];
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        test_copy_file(src, p, cuts[i]);
        print_message(" cut at %ld bytes\n", cuts[i]);
        expect_load_error(d, "model.safetensors", cuts[i] < 8 || cuts[i] < 300 ? NULL : "truncated");
        test_rm_rf(d);
        free(d);
    }
}

static void test_corrupt_header_is_rejected(void **state) {
    char *d = copy_base(), p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    /* an absurd header length */
    FILE *f = fopen(p, "r+b");
    unsigned char big[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0};
    fwrite(big, 1, 8, f);
    fclose(f);
    expect_load_error(d, "model.safetensors", "corrupt or truncated safetensors header");
    /* a header that is not JSON */
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    test_copy_file(BASE "/model.safetensors", p, -1);
    f = fopen(p, "r+b");
    fseek(f, 8, SEEK_SET);
    fwrite("\x01garbage", 1, 8, f);
    fclose(f);
    expect_load_error(d, "model.safetensors", "corrupt safetensors header");
    test_rm_rf(d);
    free(d);
}

/* Rewrites DIR/model.safetensors from the base model, dropping `drop`, adding an extra tensor
 * when `extra`, and changing the dtype string of `bad_dtype` to I64. */
static void rewrite_weights(const char *dir, const char *drop, const char *extra) {
    struct safetensors *st;
    char err[256];
    assert_int_equal(safetensors_open_file(&st, BASE "/model.safetensors", err, sizeof err), 0);
    struct st_write_tensor *ts = calloc((size_t)st->n_tensors + 1, sizeof *ts);
    int n = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        if (drop && !strcmp(t->name, drop)) continue;
        ts[n] = (struct st_write_tensor){t->name, t->dtype, t->n_dims, {0}, t->data};
        memcpy(ts[n].shape, t->shape, sizeof t->shape);
        n++;
    }
    float four[4] = {1, 2, 3, 4};
    if (extra) ts[n++] = (struct st_write_tensor){extra, ST_DTYPE_F32, 1, {4}, four};
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(safetensors_write(p, ts, n, err, sizeof err), 0);
    free(ts);
    safetensors_free(st);
}

static void test_missing_tensor_is_rejected(void **state) {
    char *d = copy_base();
    rewrite_weights(d, "model.layers.1.mlp.up_proj.weight", NULL);
    expect_load_error(d, "tensor \"model.layers.1.mlp.up_proj.weight\" is missing", NULL);
    test_rm_rf(d);
    free(d);
}

static void test_unexpected_tensor_is_rejected(void **state) {
    char *d = copy_base();
    rewrite_weights(d, NULL, "model.layers.7.mystery.weight");
    expect_load_error(d, "model.safetensors", "unexpected tensor \"model.layers.7.mystery.weight\"");
    test_rm_rf(d);
    free(d);
}

static void test_wrong_shape_is_rejected(void **state) {
    char *d = copy_base();
    patch_config(d, "intermediate_size", cJSON_CreateNumber(96));
    expect_load_error(d, "mlp.gate_proj.weight\" has shape [128, 64], config.json implies [96, 64]", "model.safetensors");
    test_rm_rf(d);
    free(d);
}

static void test_unsupported_dtype_is_rejected(void **state) {
    char *d = test_mkdtemp(), p[512];
    snprintf(p, sizeof p, "%s/x.safetensors", d);
    const char hdr[] = "{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}";
    FILE *f = fopen(p, "wb");
    uint64_t n = sizeof hdr - 1;
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, n, f);
    fwrite("12345678", 1, 8, f);
    fclose(f);
    struct safetensors *st;
    char err[512];
    assert_int_equal(safetensors_open_file(&st, p, err, sizeof err), -1);
    assert_non_null(strstr(err, "unsupported dtype I64"));
    assert_non_null(strstr(err, "x.safetensors"));
    test_rm_rf(d);
    free(d);
}

/* Splits the base model into two shards with an index; it must load and compute exactly the
 * same logits; then a broken index is rejected. */
static void test_sharded_checkpoint_loads_and_bad_index_is_rejected(void **state) {
    char *d = copy_base(), p[512], err[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    unlink(p);
    struct safetensors *st;
    assert_int_equal(safetensors_open_file(&st, BASE "/model.safetensors", err, sizeof err), 0);
    struct st_write_tensor *ts = calloc((size_t)st->n_tensors, sizeof *ts);
    cJSON *idx = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(idx, "weight_map");
    cJSON_AddObjectToObject(idx, "metadata");
    int half = st->n_tensors / 2;
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        ts[i] = (struct st_write_tensor){t->name, t->dtype, t->n_dims, {0}, t->data};
        memcpy(ts[i].shape, t->shape, sizeof t->shape);
        cJSON_AddStringToObject(wm, t->name, i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
    }
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", d);
    assert_int_equal(safetensors_write(p, ts, half, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
    assert_int_equal(safetensors_write(p, ts + half, st->n_tensors - half, err, sizeof err), 0);
    char *text = cJSON_Print(idx);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    test_write_text(p, text);
    free(text);

    /* loads; logits equal the single-file model's */
    struct backend *b = backend_cpu_create();
    struct model *m1, *m2;
    assert_int_equal(model_load(&m1, BASE, b, 8, err, sizeof err), 0);
    assert_int_equal(model_load(&m2, d, b, 8, err, sizeof err), 0);
    int V = m1->cfg.vocab_size;
    float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    int32_t tok[3] = {5, 9, 77}, pos[3] = {0, 1, 2}, ss[2] = {0, 3}, ip[2] = {0, 1}, blk = 0, row = 2;
    struct fwd_batch bt = {3, 1, tok, pos, ss, ip, &blk, NULL, 1, &row, NULL, false};
    struct kv_cache kv;
    assert_int_equal(test_kv_init(&kv, b, m1, 16, 1), 0);
    assert_int_equal(model_forward(m1, &kv, &bt, l1), 0);
    assert_int_equal(model_forward(m2, &kv, &bt, l2), 0);
    assert_memory_equal(l1, l2, sizeof(float) * V);
    kv_cache_free(&kv);
    model_free(m1);
    model_free(m2);
    free(l1);
    free(l2);

    /* a shard the index names is missing */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
    char moved[600];
    snprintf(moved, sizeof moved, "%s.bak", p);
    rename(p, moved);
    expect_load_error(d, "model-00002-of-00002.safetensors", "No such file");
    rename(moved, p);
    /* the index places a tensor in the wrong shard */
    cJSON_ReplaceItemInObject(wm, st->tensors[0].name, cJSON_CreateString("model-00002-of-00002.safetensors"));
    text = cJSON_Print(idx);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    test_write_text(p, text);
    free(text);
    expect_load_error(d, "model.safetensors.index.json", "is not in model-00002-of-00002.safetensors");

    backend_destroy(b);
    cJSON_Delete(idx);
    free(ts);
    safetensors_free(st);
    test_rm_rf(d);
    free(d);
}

/* Weights as a bf16 backend (CUDA) holds them: rounded to nearest even on upload. */
static int bf16_weight_upload(struct backend *b, const struct st_tensor *t, void **out) {
    int64_t n = st_tensor_numel(t);
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    if (!w) return BACKEND_ERR_OOM;
    for (int64_t i = 0; i < n; i++) {
        float f;
        st_tensor_to_f32(t, i, 1, &f);
        w[i] = util_f32_to_bf16(f);
    }
    *out = w;
    return BACKEND_OK;
}

static void expect_rounded(const char *what, int layer, const void *bf16, const void *f32, size_t n) {
    const uint16_t *h = bf16;
    const float *f = f32;
    for (size_t i = 0; i < n; i++)
        if (h[i] != util_f32_to_bf16(f[i])) fail_msg("layer %d %s: element %zu differs", layer, what, i);
}

/* A backend with bf16 activations gets stacks built in the source dtype, or converted part by
 * part when the parts' dtypes differ, and head-permuted for DuoAttention: every weight must be
 * the f32 reference's weight rounded to bf16, bit for bit. */
static void test_bf16_backend_weights_are_the_rounded_f32_weights(void **state) {
    /* a copy of the base model with some stacked parts in f32, with low bits set (ties included)
     * so rounding to bf16 matters: mixed-dtype stacks */
    char *d = test_mkdtemp(), p[512], err[512];
    snprintf(p, sizeof p, "%s/config.json", d);
    test_copy_file(BASE "/config.json", p, -1);
    struct safetensors *st;
    assert_int_equal(safetensors_open_file(&st, BASE "/model.safetensors", err, sizeof err), 0);
    struct st_write_tensor *ts = calloc((size_t)st->n_tensors, sizeof *ts);
    float **owned = calloc((size_t)st->n_tensors, sizeof *owned);
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        ts[i] = (struct st_write_tensor){t->name, t->dtype, t->n_dims, {0}, t->data};
        memcpy(ts[i].shape, t->shape, sizeof t->shape);
        if (strstr(t->name, "k_proj.weight") || strstr(t->name, "q_proj.bias") || strstr(t->name, "up_proj")) {
            owned[i] = malloc(sizeof(float) * (size_t)st_tensor_numel(t));
            st_tensor_to_f32(t, 0, st_tensor_numel(t), owned[i]);
            for (int64_t j = 0; j < st_tensor_numel(t); j++) {
                uint32_t u;
                memcpy(&u, &owned[i][j], 4);
                u |= (uint32_t)(j * 40503) & 0xffffu;
                memcpy(&owned[i][j], &u, 4);
            }
            ts[i].dtype = ST_DTYPE_F32;
            ts[i].data = owned[i];
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    assert_int_equal(safetensors_write(p, ts, st->n_tensors, err, sizeof err), 0);

    struct backend *cpu = backend_cpu_create(), *b16 = backend_cpu_create();
    struct backend_ops ops = *b16->ops;
    ops.act_size = 2;
    ops.weight_upload = bf16_weight_upload;
    b16->ops = &ops;
    const uint8_t streaming[] = {1, 0, 1, 0, 1, 0, 1, 0}; /* [n_layers][n_kv_heads], enough for the base */
    const char *dirs[] = {BASE, d};
    for (int k = 0; k < 4; k++) {
        struct model *mf, *mh;
        const uint8_t *s = k & 1 ? streaming : NULL;
        assert_int_equal(model_load_duo(&mf, dirs[k / 2], cpu, 8, s, err, sizeof err), 0);
        assert_int_equal(model_load_duo(&mh, dirs[k / 2], b16, 8, s, err, sizeof err), 0);
        const struct model_config *c = &mf->cfg;
        assert_true(c->n_layers * c->n_kv_heads <= (int)sizeof streaming);
        size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim, QD = (size_t)c->n_heads * c->head_dim;
        size_t QKV = QD + 2 * (size_t)c->n_kv_heads * c->head_dim;
        expect_rounded("embed", -1, mh->tok_embed, mf->tok_embed, (size_t)c->vocab_size * D);
        for (int l = 0; l < c->n_layers; l++) {
            const struct layer_weights *h = &mh->layers[l], *f = &mf->layers[l];
            expect_rounded("wqkv", l, h->wqkv, f->wqkv, QKV * D);
            if (c->qkv_bias) expect_rounded("bqkv", l, h->bqkv, f->bqkv, QKV);
            expect_rounded("wo", l, h->wo, f->wo, D * QD);
            expect_rounded("w_gateup", l, h->w_gateup, f->w_gateup, 2 * F * D);
            expect_rounded("w_down", l, h->w_down, f->w_down, D * F);
        }
        model_free(mf);
        model_free(mh);
    }
    backend_destroy(cpu);
    backend_destroy(b16);
    for (int i = 0; i < st->n_tensors; i++) free(owned[i]);
    free(owned);
    free(ts);
    safetensors_free(st);
    test_rm_rf(d);
    free(d);
}

/* config.json as transformers 4.x writes Llama 3.1: rope_theta at top, rope_scaling llama3. */
static void test_config_transformers4_llama31(void **state) {
    const char *j = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4096,\"intermediate_size\":14336,"
                    "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
                    "\"vocab_size\":128256,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-05,"
                    "\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,"
                    "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
                    "\"torch_dtype\":\"bfloat16\",\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],"
                    "\"tie_word_embeddings\":false}";
    struct model_config c;
    char err[256];
    assert_int_equal(model_config_parse(&c, j, strlen(j), err, sizeof err), 0);
    assert_int_equal(c.arch, MODEL_ARCH_LLAMA);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.rope_type, ROPE_TYPE_LLAMA3);
    assert_float_equal(c.rope_theta, 500000.0, 0);
    assert_float_equal(c.rope_factor, 8.0, 0);
    assert_int_equal(c.rope_orig_max_pos, 8192);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_ids[2], 128009);
    assert_int_equal(c.bos_id, 128000);
    assert_false(c.qkv_bias);
    /* llama3 frequencies: the highest frequency is kept, the lowest divided by the factor */
    float inv[64];
    model_rope_inv_freq(&c, inv);
    assert_float_equal(inv[0], 1.0, 1e-7);
    assert_float_equal(inv[63], 1.0 / powf(500000.0f, 126.0f / 128.0f) / 8.0, 1e-12);
}

/* Llama 2 (4.x, legacy "type" key, linear), Mistral with a window, Qwen2 biases, yarn refused. */
static void test_config_variants_and_refusals(void **state) {
    struct model_config c;
    char err[256];
    const char *l2 = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":4,\"vocab_size\":100,\"rope_scaling\":{\"type\":\"linear\",\"factor\":4}}";
    assert_int_equal(model_config_parse(&c, l2, strlen(l2), err, sizeof err), 0);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.rope_type, ROPE_TYPE_LINEAR);
    assert_float_equal(c.rope_factor, 4.0, 0);
    assert_float_equal(c.rope_theta, 10000.0, 0);

    const char *mi = "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                     "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"num_key_value_heads\":2,\"vocab_size\":100,"
                     "\"sliding_window\":4096,\"rope_theta\":1000000.0}";
    assert_int_equal(model_config_parse(&c, mi, strlen(mi), err, sizeof err), 0);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(c.arch, MODEL_ARCH_MISTRAL);

    const char *qw = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":100,"
                     "\"tie_word_embeddings\":true,\"use_sliding_window\":false,\"sliding_window\":32}";
    assert_int_equal(model_config_parse(&c, qw, strlen(qw), err, sizeof err), 0);
    assert_true(c.qkv_bias);
    assert_false(c.o_bias);
    assert_true(c.tie_embeddings);
    assert_int_equal(c.sliding_window, 0);

    const char *yarn = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":4,\"vocab_size\":100,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}";
    assert_int_equal(model_config_parse(&c, yarn, strlen(yarn), err, sizeof err), -1);
    assert_non_null(strstr(err, "unsupported RoPE type \"yarn\""));

    const char *gqa = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
                      "\"num_attention_heads\":6,\"num_key_value_heads\":4,\"vocab_size\":100}";
    assert_int_equal(model_config_parse(&c, gqa, strlen(gqa), err, sizeof err), -1);
    assert_non_null(strstr(err, "not a multiple"));

    const char *neg = "{\"model_type\":\"llama\",\"hidden_size\":-64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
                      "\"num_attention_heads\":4,\"vocab_size\":100}";
    assert_int_equal(model_config_parse(&c, neg, strlen(neg), err, sizeof err), -1);
    assert_non_null(strstr(err, "hidden_size"));

    const char *missing = "{\"model_type\":\"llama\",\"hidden_size\":64}";
    assert_int_equal(model_config_parse(&c, missing, strlen(missing), err, sizeof err), -1);
    assert_non_null(strstr(err, "missing \"intermediate_size\""));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_directory_names_config_json),
        cmocka_unit_test(test_config_not_json_is_rejected),
        cmocka_unit_test(test_unknown_architecture_is_rejected),
        cmocka_unit_test(test_missing_safetensors_is_rejected),
        cmocka_unit_test(test_truncated_safetensors_is_rejected_at_every_cut),
        cmocka_unit_test(test_corrupt_header_is_rejected),
        cmocka_unit_test(test_missing_tensor_is_rejected),
        cmocka_unit_test(test_unexpected_tensor_is_rejected),
        cmocka_unit_test(test_wrong_shape_is_rejected),
        cmocka_unit_test(test_unsupported_dtype_is_rejected),
        cmocka_unit_test(test_sharded_checkpoint_loads_and_bad_index_is_rejected),
        cmocka_unit_test(test_bf16_backend_weights_are_the_rounded_f32_weights),
        cmocka_unit_test(test_config_transformers4_llama31),
        cmocka_unit_test(test_config_variants_and_refusals),
    };
    return cmocka_run_group_tests_name("loader", tests, NULL, NULL);
}
