#!/usr/bin/env python3
"""Writes a random-weight checkpoint with the exact shapes of Llama-3-8B (32 layers, hidden 4096,
intermediate 14336, 32 query / 8 KV heads, vocab 128256, bf16 safetensors, llama3 RoPE) and the
llama3 tokenizer, for honest speed figures. Run it on the GPU machine (torch + safetensors);
never commit its output (16 GB).

    python3 scripts/make_llama8b.py OUT_DIR [--tokenizer ../shared/tokenizers/llama3]"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu",
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokenizer", default="../shared/tokenizers/llama3")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    c = CONFIG
    D, F, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]

    def w(*shape, std=0.02):
        return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * std).to(torch.bfloat16).cpu()

    shards, index = [], {}
    def flush(tensors, i):
        name = f"model-{i:05d}-of-00005.safetensors"
        save_file(tensors, os.path.join(a.out, name), metadata={"format": "pt"})
        for k in tensors:
            index[k] = name

    flush({"model.embed_tokens.weight": w(V, D), "model.norm.weight": torch.ones(D, dtype=torch.bfloat16),
           "lm_head.weight": w(V, D)}, 1)
    per = L // 4
    for s in range(4):
        t = {}
        for l in range(s * per, (s + 1) * per):
            p = f"model.layers.{l}."
            t[p + "input_layernorm.weight"] = torch.ones(D, dtype=torch.bfloat16)
            t[p + "post_attention_layernorm.weight"] = torch.ones(D, dtype=torch.bfloat16)
            t[p + "self_attn.q_proj.weight"] = w(H * hd, D)
            t[p + "self_attn.k_proj.weight"] = w(KV * hd, D)
            t[p + "self_attn.v_proj.weight"] = w(KV * hd, D)
            t[p + "self_attn.o_proj.weight"] = w(D, H * hd)
            t[p + "mlp.gate_proj.weight"] = w(F, D)
            t[p + "mlp.up_proj.weight"] = w(F, D)
            t[p + "mlp.down_proj.weight"] = w(D, F)
        flush(t, s + 2)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, fn), os.path.join(a.out, fn))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
