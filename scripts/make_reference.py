#!/usr/bin/env python3
"""Writes the HF-parity fixtures under tests/fixtures/hf/<family>/: a tiny random-weight model
of each supported family (bf16 safetensors + config.json, saved by transformers itself) and
expected.json with HF transformers' greedy ids and top-5 logprobs for prompts of 1 to ~1500
tokens. Needs torch and transformers (the GPU machine has them; see ../shared/device/README.md):

    python3 scripts/make_reference.py --out tests/fixtures/hf [--only llama_hd128]

The reference runs in float32 on the CPU (weights upcast exactly from bf16), so the fixtures
hold the model's math, not one GPU's rounding."""
import argparse
import json
import os

import torch
import transformers
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config)

PROMPT_LENS = [1, 5, 33, 200, 1500]
NEW_TOKENS = 12
TOP_K = 5
VOCAB = 512


def families():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  max_position_embeddings=2048, rms_norm_eps=1e-5, initializer_range=0.1,
                  bos_token_id=1, eos_token_id=2)
    return {
        # Llama-3 style: GQA 8/2, head_dim 16 != hidden/heads, llama3 RoPE scaling active past 256
        "llama3": LlamaConfig(**common, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                              tie_word_embeddings=False,
                              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 256}),
        # Llama-2 style: MHA, linear RoPE scaling
        "llama2": LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=4,
                              tie_word_embeddings=False,
                              rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
        # Mistral: GQA, sliding window shorter than the longest prompt
        "mistral": MistralConfig(**common, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                                 sliding_window=128, tie_word_embeddings=False,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        # Qwen2: q/k/v biases, tied embeddings
        "qwen2": Qwen2Config(**common, num_attention_heads=4, num_key_value_heads=2,
                             tie_word_embeddings=True, use_sliding_window=False,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        # Llama at head dim 128, GQA 4/1: the real models' head dim, where the CUDA attention runs
        # its wgmma prefill kernel and the cooperative decode path (the families above are 8-16)
        "llama_hd128": LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                                   tie_word_embeddings=False,
                                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/hf")
    ap.add_argument("--only", default="", help="these families only (comma-separated; the others keep their files)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    torch.backends.cuda.matmul.allow_tf32 = False
    for i, (name, cfg) in enumerate(families().items()):  # (i seeds each family: add new ones last)
        if only and name not in only:
            continue
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        torch.manual_seed(1234 + i)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        with torch.no_grad():  # random biases and norm gains too, so they are exercised
            for n, p in model.named_parameters():
                if n.endswith("bias") or "norm" in n:
                    p.add_(torch.randn_like(p) * 0.1)
        model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
        for f in os.listdir(d):
            if f not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(d, f))
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        gen = torch.Generator().manual_seed(99 + i)
        cases = []
        for n in PROMPT_LENS:
            prompt = torch.randint(3, VOCAB, (1, n), generator=gen)
            with torch.no_grad():
                out = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                   min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                   return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
            ids = out.sequences[0, n:].tolist()
            top, margins = [], []
            for lg in out.logits:
                lp = torch.log_softmax(lg[0].float(), dim=-1)
                v, ix = torch.topk(lp, TOP_K)
                top.append([[int(a), float(b)] for a, b in zip(ix, v)])
                margins.append(float(v[0] - v[1]))
            cases.append({"prompt_ids": prompt[0].tolist(), "greedy_ids": ids, "top_logprobs": top,
                          "min_top2_margin": min(margins)})
            print(f"{name}: prompt {n:5d} -> {ids[:6]}... min top-2 margin {min(margins):.4f}")
        meta = {"family": name, "transformers": transformers.__version__, "torch": torch.__version__,
                "new_tokens": NEW_TOKENS, "top_k": TOP_K, "cases": cases}
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump(meta, f)


if __name__ == "__main__":
    main()
