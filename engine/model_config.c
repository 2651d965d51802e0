#include "engine/model_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/util.h"

const char *model_arch_name(enum model_arch arch) {
    switch (arch) {
    case MODEL_ARCH_LLAMA: return "LlamaForCausalLM";
    case MODEL_ARCH_MISTRAL: return "MistralForCausalLM";
    case MODEL_ARCH_QWEN2: return "Qwen2ForCausalLM";
    }
    return "?";
}

/* Reads an integer field; returns 1 if present and valid, 0 if absent or null, -1 if malformed. */
static int get_int(const cJSON *o, const char *key, long long lo, long long hi, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) return 0;
    if (!cJSON_IsNumber(it)) return -1;
    double v = it->valuedouble;
    if (!isfinite(v) || v != floor(v) || v < (double)lo || v > (double)hi) return -1;
    *out = (int)v;
    return 1;
}

static int get_float(const cJSON *o, const char *key, float *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) return 0;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) return -1;
    *out = (float)it->valuedouble;
    return 1;
}

static int get_bool(const cJSON *o, const char *key, bool *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) return 0;
    if (!cJSON_IsBool(it)) return -1;
    *out = cJSON_IsTrue(it);
    return 1;
}

#define REQUIRE_INT(key, lo, hi, dst)                                                          \
    do {                                                                                       \
        int r_ = get_int(root, key, lo, hi, dst);                                              \
        if (r_ == 0) { rc = util_err(err, errlen, "missing \"%s\"", key); goto out; }          \
        if (r_ < 0) { rc = util_err(err, errlen, "\"%s\" must be an integer in [%lld, %lld]", key, (long long)(lo), (long long)(hi)); goto out; } \
    } while (0)

/* The RoPE block: 5.x "rope_parameters" holds rope_theta too; 4.x has "rope_theta" at the
 * top and an optional "rope_scaling" whose type key is "rope_type" or the older "type". */
static int parse_rope(struct model_config *cfg, const cJSON *root, char *err, size_t errlen) {
    cfg->rope_type = ROPE_TYPE_DEFAULT;
    cfg->rope_theta = 10000.0f;
    cfg->rope_factor = 1.0f;
    if (get_float(root, "rope_theta", &cfg->rope_theta) < 0) return util_err(err, errlen, "\"rope_theta\" must be a number");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *p = NULL;
    if (rp && !cJSON_IsNull(rp)) p = rp;
    else if (rs && !cJSON_IsNull(rs)) p = rs;
    if (!p) return 0;
    const char *what = p == rp ? "rope_parameters" : "rope_scaling";
    if (!cJSON_IsObject(p)) return util_err(err, errlen, "\"%s\" must be an object", what);
    if (get_float(p, "rope_theta", &cfg->rope_theta) < 0) return util_err(err, errlen, "\"%s.rope_theta\" must be a number", what);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "default";
    if (strcmp(type, "default") == 0) {
        cfg->rope_type = ROPE_TYPE_DEFAULT;
    } else if (strcmp(type, "linear") == 0) {
        cfg->rope_type = ROPE_TYPE_LINEAR;
        if (get_float(p, "factor", &cfg->rope_factor) <= 0 || cfg->rope_factor <= 0)
            return util_err(err, errlen, "\"%s\": linear RoPE needs a positive \"factor\"", what);
    } else if (strcmp(type, "llama3") == 0) {
        cfg->rope_type = ROPE_TYPE_LLAMA3;
        if (get_float(p, "factor", &cfg->rope_factor) <= 0 || cfg->rope_factor <= 0 ||
            get_float(p, "low_freq_factor", &cfg->rope_low_freq_factor) <= 0 ||
            get_float(p, "high_freq_factor", &cfg->rope_high_freq_factor) <= 0 ||
            get_int(p, "original_max_position_embeddings", 1, 1 << 30, &cfg->rope_orig_max_pos) <= 0 ||
            cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor)
            return util_err(err, errlen,
                            "\"%s\": llama3 RoPE needs factor, low_freq_factor < high_freq_factor and "
                            "original_max_position_embeddings", what);
    } else {
        return util_err(err, errlen, "unsupported RoPE type \"%s\" (supported: default, linear, llama3)", type);
    }
    if (!(cfg->rope_theta > 0)) return util_err(err, errlen, "rope_theta must be positive");
    return 0;
}

/* eos_token_id may be an int or a list of ints. */
static int parse_eos(struct model_config *cfg, const cJSON *root, char *err, size_t errlen) {
    cfg->n_eos = 0;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (!e || cJSON_IsNull(e)) return 0;
    if (cJSON_IsNumber(e)) {
        if (get_int(root, "eos_token_id", 0, cfg->vocab_size - 1, &cfg->eos_ids[0]) < 0)
            return util_err(err, errlen, "\"eos_token_id\" out of the vocabulary");
        cfg->n_eos = 1;
        return 0;
    }
    if (!cJSON_IsArray(e)) return util_err(err, errlen, "\"eos_token_id\" must be an integer or a list");
    const cJSON *it;
    cJSON_ArrayForEach(it, e) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (v < 0 || v >= cfg->vocab_size || v != floor(v))
            return util_err(err, errlen, "\"eos_token_id\" holds a value outside the vocabulary");
        if (cfg->n_eos < MODEL_CONFIG_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = (int)v;
    }
    return 0;
}

/* The architecture: "architectures"[0], else one implied by "model_type". */
static int parse_arch(struct model_config *cfg, const cJSON *root, char *err, size_t errlen) {
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const char *arch = cJSON_IsString(a0) ? a0->valuestring : NULL;
    if (!arch) {
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
        const char *m = cJSON_IsString(mt) ? mt->valuestring : "";
        arch = !strcmp(m, "llama") ? "LlamaForCausalLM" : !strcmp(m, "mistral") ? "MistralForCausalLM"
             : !strcmp(m, "qwen2") ? "Qwen2ForCausalLM" : NULL;
    }
    if (!arch) return util_err(err, errlen, "no \"architectures\" or known \"model_type\"");
    if (!strcmp(arch, "LlamaForCausalLM")) cfg->arch = MODEL_ARCH_LLAMA;
    else if (!strcmp(arch, "MistralForCausalLM")) cfg->arch = MODEL_ARCH_MISTRAL;
    else if (!strcmp(arch, "Qwen2ForCausalLM")) cfg->arch = MODEL_ARCH_QWEN2;
    else
        return util_err(err, errlen, "unsupported architecture \"%s\" (supported: LlamaForCausalLM, "
                        "MistralForCausalLM, Qwen2ForCausalLM)", arch);
    return 0;
}

/* What varies within the family (cfg->arch set): tied embeddings, biases, the activation and
 * the sliding window. */
static int parse_variant(struct model_config *cfg, const cJSON *root, char *err, size_t errlen) {
    /* transformers defaults: Llama/Mistral untied, Qwen2 untied unless the key says so. */
    cfg->tie_embeddings = false;
    if (get_bool(root, "tie_word_embeddings", &cfg->tie_embeddings) < 0)
        return util_err(err, errlen, "\"tie_word_embeddings\" must be true or false");
    bool attn_bias = false, mlp_bias = false;
    if (get_bool(root, "attention_bias", &attn_bias) < 0 || get_bool(root, "mlp_bias", &mlp_bias) < 0)
        return util_err(err, errlen, "\"attention_bias\"/\"mlp_bias\" must be true or false");
    if (mlp_bias) return util_err(err, errlen, "\"mlp_bias\": true is not supported");
    if (cfg->arch == MODEL_ARCH_QWEN2) {
        cfg->qkv_bias = true; /* Qwen2 always has q/k/v biases and no o_proj bias */
    } else if (cfg->arch == MODEL_ARCH_LLAMA) {
        cfg->qkv_bias = cfg->o_bias = attn_bias;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && (!strcmp(act->valuestring, "silu") || !strcmp(act->valuestring, "swish"))))
        return util_err(err, errlen, "unsupported \"hidden_act\" (only silu)");
    /* Sliding window: Mistral uses "sliding_window" when set; Qwen2 only with use_sliding_window
     * (and then only above max_window_layers, which we refuse rather than half-honour). */
    cfg->sliding_window = 0;
    if (cfg->arch == MODEL_ARCH_MISTRAL) {
        if (get_int(root, "sliding_window", 1, 1 << 30, &cfg->sliding_window) < 0)
            return util_err(err, errlen, "\"sliding_window\" must be a positive integer or null");
    } else if (cfg->arch == MODEL_ARCH_QWEN2) {
        bool use_sw = false;
        get_bool(root, "use_sliding_window", &use_sw);
        if (use_sw) return util_err(err, errlen, "Qwen2 \"use_sliding_window\": true is not supported");
    }
    return 0;
}

int model_config_parse(struct model_config *cfg, const char *json, size_t len, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return util_err(err, errlen, "not a JSON object");
    }
    int rc = 0;
    if (parse_arch(cfg, root, err, errlen) < 0) {
        rc = -1;
        goto out;
    }
    REQUIRE_INT("hidden_size", 1, 1 << 20, &cfg->dim);
    REQUIRE_INT("intermediate_size", 1, 1 << 22, &cfg->hidden_dim);
    REQUIRE_INT("num_hidden_layers", 1, 4096, &cfg->n_layers);
    REQUIRE_INT("num_attention_heads", 1, 4096, &cfg->n_heads);
    REQUIRE_INT("vocab_size", 1, 1 << 28, &cfg->vocab_size);
    cfg->n_kv_heads = cfg->n_heads;
    if (get_int(root, "num_key_value_heads", 1, 4096, &cfg->n_kv_heads) < 0) {
        rc = util_err(err, errlen, "\"num_key_value_heads\" must be a positive integer");
        goto out;
    }
    if (cfg->n_heads % cfg->n_kv_heads) {
        rc = util_err(err, errlen, "num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                      cfg->n_heads, cfg->n_kv_heads);
        goto out;
    }
    cfg->head_dim = cfg->dim / cfg->n_heads;
    if (get_int(root, "head_dim", 2, 1 << 16, &cfg->head_dim) < 0) {
        rc = util_err(err, errlen, "\"head_dim\" must be a positive integer");
        goto out;
    }
    if (cfg->head_dim % 2 || (cfg->head_dim == cfg->dim / cfg->n_heads && cfg->dim % cfg->n_heads)) {
        rc = util_err(err, errlen, "head_dim %d is odd or hidden_size %d does not split into %d heads",
                      cfg->head_dim, cfg->dim, cfg->n_heads);
        goto out;
    }
    cfg->max_pos = 2048;
    if (get_int(root, "max_position_embeddings", 1, 1 << 30, &cfg->max_pos) < 0) {
        rc = util_err(err, errlen, "\"max_position_embeddings\" must be a positive integer");
        goto out;
    }
    cfg->norm_eps = 1e-6f;
    if (get_float(root, "rms_norm_eps", &cfg->norm_eps) < 0 || !(cfg->norm_eps >= 0)) {
        rc = util_err(err, errlen, "\"rms_norm_eps\" must be a non-negative number");
        goto out;
    }
    if (parse_variant(cfg, root, err, errlen) < 0) {
        rc = -1;
        goto out;
    }
    if (parse_rope(cfg, root, err, errlen) < 0) {
        rc = -1;
        goto out;
    }
    cfg->bos_id = -1;
    if (get_int(root, "bos_token_id", 0, cfg->vocab_size - 1, &cfg->bos_id) < 0) {
        rc = util_err(err, errlen, "\"bos_token_id\" is outside the vocabulary");
        goto out;
    }
    if (parse_eos(cfg, root, err, errlen) < 0) rc = -1;
out:
    cJSON_Delete(root);
    return rc;
}

int model_config_check_dir(const char *dir, char *err, size_t errlen) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return errno == ENOENT ? util_err(err, errlen, "model directory not found: %s", dir)
                               : util_err(err, errlen, "model directory %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return util_err(err, errlen, "%s is not a directory (-m takes a Hugging Face model directory)", dir);
    char *path = util_path_join(dir, "config.json");
    if (!path) return util_err(err, errlen, "out of memory");
    int rc = 0;
    if (access(path, R_OK) != 0)
        rc = errno == ENOENT ? util_err(err, errlen,
                                        "%s not found: %s is not a Hugging Face model directory (it needs "
                                        "config.json, model.safetensors and tokenizer.json)", path, dir)
                             : util_err(err, errlen, "%s: %s", path, strerror(errno));
    free(path);
    return rc;
}

int model_config_load(struct model_config *cfg, const char *dir, char *err, size_t errlen) {
    if (model_config_check_dir(dir, err, errlen) != 0) return -1;
    char *path = util_path_join(dir, "config.json");
    char *text = NULL;
    size_t len = 0;
    int rc;
    if (util_read_file(path, &text, &len) != 0) {
        rc = util_err(err, errlen, "%s: %s", path, strerror(errno));
    } else {
        char why[256];
        rc = model_config_parse(cfg, text, len, why, sizeof why);
        if (rc < 0) util_err(err, errlen, "%s: %s", path, why);
    }
    free(text);
    free(path);
    return rc;
}
