/* model_config: the parts of a Hugging Face config.json that define the forward pass.
 * Accepts LlamaForCausalLM (Llama 2/3/3.1), MistralForCausalLM and Qwen2ForCausalLM as
 * written by transformers 4.x (rope_theta, rope_scaling, torch_dtype) and 5.x
 * (rope_parameters, dtype). Anything it cannot honour exactly is refused with a message. */
#ifndef DUO_MODEL_CONFIG_H
#define DUO_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

enum model_arch { MODEL_ARCH_LLAMA, MODEL_ARCH_MISTRAL, MODEL_ARCH_QWEN2 };
enum rope_type { ROPE_TYPE_DEFAULT, ROPE_TYPE_LINEAR, ROPE_TYPE_LLAMA3 };

#define MODEL_CONFIG_MAX_EOS 8

struct model_config {
    enum model_arch arch;
    int dim;          // hidden_size
    int hidden_dim;   // intermediate_size (SwiGLU)
    int n_layers;     // num_hidden_layers
    int n_heads;      // num_attention_heads
    int n_kv_heads;   // num_key_value_heads (GQA); n_heads % n_kv_heads == 0
    int head_dim;     // head_dim, default dim / n_heads
    int vocab_size;
    int max_pos;      // max_position_embeddings
    float norm_eps;   // rms_norm_eps
    bool tie_embeddings;
    bool qkv_bias;    // q/k/v projections have a bias (Qwen2, Llama attention_bias)
    bool o_bias;      // o_proj has a bias (Llama attention_bias)
    int sliding_window; // Mistral/Qwen2 sliding window in tokens; 0 = none
    // RoPE
    enum rope_type rope_type;
    float rope_theta;
    float rope_factor;           // linear and llama3
    float rope_low_freq_factor;  // llama3
    float rope_high_freq_factor; // llama3
    int rope_orig_max_pos;       // llama3 original_max_position_embeddings
    // special ids from config.json (-1 when absent)
    int bos_id;
    int eos_ids[MODEL_CONFIG_MAX_EOS];
    int n_eos;
};

/* Parses config.json text. On failure returns -1 with a one-line reason in err. */
int model_config_parse(struct model_config *cfg, const char *json, size_t len, char *err, size_t errlen);

/* Whether dir looks like a Hugging Face model directory: it exists, is a directory and holds a
 * readable config.json. Cheap (no parsing); on failure -1 with a one-line reason in err. */
int model_config_check_dir(const char *dir, char *err, size_t errlen);

/* Reads DIR/config.json (after model_config_check_dir); errors name the file. */
int model_config_load(struct model_config *cfg, const char *dir, char *err, size_t errlen);

const char *model_arch_name(enum model_arch arch);

#endif
