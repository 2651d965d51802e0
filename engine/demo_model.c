#include "engine/demo_model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/safetensors.h"
#include "engine/util.h"

#define DEMO_NAME "demo-llama-v1"
#define DEMO_SEED 20241018ull
enum { DEMO_DIM = 64, DEMO_HIDDEN = 172, DEMO_LAYERS = 2, DEMO_HEADS = 4, DEMO_KV_HEADS = 2,
       DEMO_VOCAB = 3 + 256, DEMO_CTX = 4096 };

static const char demo_config[] =
    "{\n"
    "  \"architectures\": [\"LlamaForCausalLM\"],\n"
    "  \"model_type\": \"llama\",\n"
    "  \"hidden_size\": 64,\n"
    "  \"intermediate_size\": 172,\n"
    "  \"num_hidden_layers\": 2,\n"
    "  \"num_attention_heads\": 4,\n"
    "  \"num_key_value_heads\": 2,\n"
    "  \"head_dim\": 16,\n"
    "  \"vocab_size\": 259,\n"
    "  \"max_position_embeddings\": 4096,\n"
    "  \"rms_norm_eps\": 1e-05,\n"
    "  \"rope_theta\": 10000.0,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"bos_token_id\": 1,\n"
    "  \"eos_token_id\": 2,\n"
    "  \"torch_dtype\": \"float32\"\n"
    "}\n";

/* A ChatML-style template so chat requests work on the demo model too. */
static const char demo_chat_template[] =
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '</s>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

int demo_model_dir(char *out, size_t outlen) {
    const char *c = getenv("DUOSERVE_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int n;
    if (c && *c) n = snprintf(out, outlen, "%s/%s", c, DEMO_NAME);
    else if (x && *x) n = snprintf(out, outlen, "%s/duoserve/%s", x, DEMO_NAME);
    else n = snprintf(out, outlen, "%s/.cache/duoserve/%s", h && *h ? h : "/tmp", DEMO_NAME);
    return n > 0 && (size_t)n < outlen ? 0 : -1;
}

static int mkdir_p(const char *path) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -1;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* SentencePiece-style byte-fallback BPE with no merges: every byte is one token. */
static char *demo_tokenizer_json(void) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    const char *specials[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", i);
        cJSON_AddStringToObject(t, "content", specials[i]);
        cJSON_AddBoolToObject(t, "single_word", 0);
        cJSON_AddBoolToObject(t, "lstrip", 0);
        cJSON_AddBoolToObject(t, "rstrip", 0);
        cJSON_AddBoolToObject(t, "normalized", 0);
        cJSON_AddBoolToObject(t, "special", 1);
        cJSON_AddItemToArray(added, t);
    }
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddNullToObject(root, "pre_tokenizer");
    cJSON *post = cJSON_AddObjectToObject(root, "post_processor");
    cJSON_AddStringToObject(post, "type", "TemplateProcessing");
    cJSON *single = cJSON_AddArrayToObject(post, "single");
    cJSON *st = cJSON_CreateObject(), *sq = cJSON_CreateObject();
    cJSON *sti = cJSON_AddObjectToObject(st, "SpecialToken");
    cJSON_AddStringToObject(sti, "id", "<s>");
    cJSON_AddNumberToObject(sti, "type_id", 0);
    cJSON *sqi = cJSON_AddObjectToObject(sq, "Sequence");
    cJSON_AddStringToObject(sqi, "id", "A");
    cJSON_AddNumberToObject(sqi, "type_id", 0);
    cJSON_AddItemToArray(single, st);
    cJSON_AddItemToArray(single, sq);
    cJSON_AddItemToObject(post, "pair", cJSON_Duplicate(single, 1));
    cJSON *sp = cJSON_AddObjectToObject(post, "special_tokens");
    cJSON *bos = cJSON_AddObjectToObject(sp, "<s>");
    cJSON_AddStringToObject(bos, "id", "<s>");
    cJSON *ids = cJSON_AddArrayToObject(bos, "ids");
    cJSON_AddItemToArray(ids, cJSON_CreateNumber(1));
    cJSON *toks = cJSON_AddArrayToObject(bos, "tokens");
    cJSON_AddItemToArray(toks, cJSON_CreateString("<s>"));
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "Sequence");
    cJSON *decs = cJSON_AddArrayToObject(dec, "decoders");
    cJSON *d1 = cJSON_CreateObject(), *d2 = cJSON_CreateObject();
    cJSON_AddStringToObject(d1, "type", "ByteFallback");
    cJSON_AddStringToObject(d2, "type", "Fuse");
    cJSON_AddItemToArray(decs, d1);
    cJSON_AddItemToArray(decs, d2);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddStringToObject(model, "unk_token", "<unk>");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 1);
    cJSON_AddBoolToObject(model, "byte_fallback", 1);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int i = 0; i < 3; i++) cJSON_AddNumberToObject(vocab, specials[i], i);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        cJSON_AddNumberToObject(vocab, name, 3 + b);
    }
    cJSON_AddArrayToObject(model, "merges");
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

static char *demo_tokenizer_config(void) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bos_token", "<s>");
    cJSON_AddStringToObject(root, "eos_token", "</s>");
    cJSON_AddStringToObject(root, "unk_token", "<unk>");
    cJSON_AddBoolToObject(root, "add_bos_token", 1);
    cJSON_AddBoolToObject(root, "add_eos_token", 0);
    cJSON_AddStringToObject(root, "tokenizer_class", "LlamaTokenizerFast");
    cJSON_AddNumberToObject(root, "model_max_length", DEMO_CTX);
    cJSON_AddStringToObject(root, "chat_template", demo_chat_template);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

static int write_text(const char *dir, const char *name, const char *text, char *err, size_t errlen) {
    char *path = util_path_join(dir, name);
    int rc = text && path ? util_write_file(path, text, strlen(text)) : -1;
    if (rc) util_err(err, errlen, "%s: %s", path ? path : name, text ? strerror(errno) : "out of memory");
    free(path);
    return rc;
}

int demo_model_write(const char *dir, char *err, size_t errlen) {
    if (mkdir_p(dir) != 0) return util_err(err, errlen, "%s: %s", dir, strerror(errno));
    enum { D = DEMO_DIM, F = DEMO_HIDDEN, L = DEMO_LAYERS, HD = DEMO_DIM / DEMO_HEADS, V = DEMO_VOCAB };
    const int QD = DEMO_HEADS * HD, KD = DEMO_KV_HEADS * HD;
    enum { MAXT = 3 + 11 * L };
    struct st_write_tensor ts[MAXT];
    char names[MAXT][64];
    float *bufs[MAXT];
    int n = 0;
    struct util_rng rng;
    util_rng_seed(&rng, DEMO_SEED);
    /* weights ~ N(0, std); norms are ones, like a freshly initialised HF model */
#define ADD(nm, d0, d1, std)                                                      \
    do {                                                                          \
        snprintf(names[n], sizeof names[n], "%s", nm);                            \
        size_t cnt = (size_t)(d0) * (size_t)((d1) ? (d1) : 1);                    \
        bufs[n] = malloc(cnt * sizeof(float));                                    \
        for (size_t i_ = 0; bufs[n] && i_ < cnt; i_++)                            \
            bufs[n][i_] = (std) > 0 ? (std) * util_rng_normal(&rng) : 1.0f;       \
        ts[n] = (struct st_write_tensor){names[n], ST_DTYPE_F32, (d1) ? 2 : 1, {(d0), (d1)}, bufs[n]}; \
        n++;                                                                      \
    } while (0)
    ADD("model.embed_tokens.weight", V, D, 1.0f);
    for (int l = 0; l < L; l++) {
        char nm[64];
#define LADD(suffix, d0, d1, std)                                              \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);              \
        ADD(nm, d0, d1, std)
        LADD("input_layernorm.weight", D, 0, 0.0f);
        LADD("post_attention_layernorm.weight", D, 0, 0.0f);
        LADD("self_attn.q_proj.weight", QD, D, 0.125f);
        LADD("self_attn.k_proj.weight", KD, D, 0.125f);
        LADD("self_attn.v_proj.weight", KD, D, 0.125f);
        LADD("self_attn.o_proj.weight", D, QD, 0.125f);
        LADD("mlp.gate_proj.weight", F, D, 0.125f);
        LADD("mlp.up_proj.weight", F, D, 0.125f);
        LADD("mlp.down_proj.weight", D, F, 0.076f);
#undef LADD
    }
    ADD("model.norm.weight", D, 0, 0.0f);
    ADD("lm_head.weight", V, D, 0.125f);
#undef ADD
    int rc = 0;
    for (int i = 0; i < n; i++)
        if (!bufs[i]) rc = util_err(err, errlen, "out of memory");
    char *path = util_path_join(dir, "model.safetensors");
    if (!rc) rc = safetensors_write(path, ts, n, err, errlen);
    free(path);
    for (int i = 0; i < n; i++) free(bufs[i]);
    char *tok = demo_tokenizer_json(), *tcfg = demo_tokenizer_config();
    if (!rc) rc = write_text(dir, "tokenizer.json", tok, err, errlen);
    if (!rc) rc = write_text(dir, "tokenizer_config.json", tcfg, err, errlen);
    /* config.json last: its presence marks a complete model */
    if (!rc) rc = write_text(dir, "config.json", demo_config, err, errlen);
    free(tok);
    free(tcfg);
    return rc;
}

int demo_model_ensure(char *out, size_t outlen, char *err, size_t errlen) {
    if (demo_model_dir(out, outlen) != 0) return util_err(err, errlen, "cache path too long");
    char *cfg = util_path_join(out, "config.json");
    int have = cfg && access(cfg, R_OK) == 0;
    free(cfg);
    if (have) return 0;
    return demo_model_write(out, err, errlen);
}
