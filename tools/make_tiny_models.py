#!/usr/bin/env python3
"""Build the tiny random test models of tests/models (needs torch + transformers 5.17).

  python3 tools/make_tiny_models.py [--out tests/models] [--only NAME ...] [--no-quant]

Models (bf16 safetensors via save_pretrained; all weights initialised on the CPU with fixed seeds,
so the files are reproducible with the same torch/transformers versions):
  glm5-tiny    glm_moe_dsa   docs/model.md §tiny-models, smaller dims, yarn rope, indexer_types full/full/shared/full
  v32-tiny     deepseek_v32  same dims (indexer on every layer, half-split indexer rope)
  v3-tiny      deepseek_v3   same dims without indexer, intermediate_size 160 (ragged FP8 blocks)
  glm5-tiny-b  glm_moe_dsa   other dims ("unseen config"), default rope theta 1e6
Quantized variants, written by tools/quantize_np.py (numpy; no torch):
  glm5-tiny-mxfp4  from glm5-tiny: routed experts Quark MXFP4 (OCP floor scale rule, RNE)
  v3-tiny-fp8      from v3-tiny: DeepSeek block FP8 (128x128) for every Linear but lm_head/router
MTP variants (numpy; no torch): the base model's files plus one multi-token-prediction layer
model.layers.{L}.* (num_nextn_predict_layers 1), random with a fixed numpy seed (tools/mtp_reference.py
documents the layer):
  glm5-tiny-mtp        from glm5-tiny: GLM layout (no embedding / head copies: the main ones are used)
  v3-tiny-mtp          from v3-tiny: DeepSeek layout, with its own embed_tokens and shared_head.head
                       (random here, unlike the real checkpoints' copies, so a test sees which one is read)
  glm5-tiny-mxfp4-mtp  glm5-tiny-mtp through quantize_np mxfp4 (the MTP layer's routed experts MXFP4 too)

After init (docs/model.md §tiny-models): every RMSNorm/LayerNorm weight = 1 + 0.2 N(0,1),
indexer k_norm.bias = 0.2 N(0,1), e_score_correction_bias = 0.05 N(0,1). The model is then cast to
bf16 except e_score_correction_bias, which is kept (and saved) in fp32 with its unrounded values.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quantize_np  # noqa: E402

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48,
              kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24,
              n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
              routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
              rms_norm_eps=1e-5, max_position_embeddings=128, initializer_range=0.1,
              tie_word_embeddings=False, rope_parameters=YARN)
DSA = dict(index_n_heads=16, index_head_dim=32, index_topk=8)

# name -> (architecture, config kwargs, seed). Seeds were picked (seed scan 0..11 with the fixed prompt of
# tools/dump_reference.py) for healthy indexer top-k gaps and router margins; see tests/golden/*/meta.json.
MODELS = {
    "glm5-tiny": ("glm", dict(COMMON, **DSA, indexer_types=["full", "full", "shared", "full"]), 9),
    "v32-tiny": ("v32", dict(COMMON, **DSA), 8),
    "v3-tiny": ("v3", dict(COMMON, intermediate_size=160), 0),
    "glm5-tiny-b": ("glm", dict(vocab_size=200, hidden_size=96, intermediate_size=160, moe_intermediate_size=32,
                                num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=6,
                                q_lora_rank=40, kv_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                v_head_dim=20, n_routed_experts=6, n_shared_experts=2, num_experts_per_tok=3,
                                n_group=3, topk_group=2, routed_scaling_factor=1.5, norm_topk_prob=True,
                                first_k_dense_replace=2, rms_norm_eps=1e-5, max_position_embeddings=128,
                                initializer_range=0.1, tie_word_embeddings=False,
                                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                index_n_heads=8, index_head_dim=24, index_topk=12,
                                indexer_types=["full", "shared", "full"]), 7),
}
QUANT = {"glm5-tiny-mxfp4": ("mxfp4", "glm5-tiny"), "v3-tiny-fp8": ("fp8", "v3-tiny")}
# name -> (base model, numpy seed, own embed_tokens / shared_head.head copies); quantized MTP variants after.
# Seeds picked from a scan (glm 20..31 with its MXFP4 variant, v3 0..7) for router, group, indexer and draft
# margins (tests/golden/*-mtp/meta.json).
MTP = {"glm5-tiny-mtp": ("glm5-tiny", 23, False), "v3-tiny-mtp": ("v3-tiny", 5, True)}
QUANT_MTP = {"glm5-tiny-mxfp4-mtp": ("mxfp4", "glm5-tiny-mtp")}


def add_mtp_layer(src, dst, seed, copies):
    """dst = src + one random MTP layer model.layers.{L}.*: every tensor of the last main layer that has it
    (attention, indexer, MoE) with fresh values by the same init rules (norm weights 1 + 0.2 N, k_norm.bias
    0.2 N, e_score_correction_bias 0.05 N in F32, other weights N(0, initializer_range)), plus enorm, hnorm,
    eh_proj [D, 2D], shared_head.norm and, with `copies`, embed_tokens and shared_head.head."""
    T, meta = quantize_np.load_dir(src)
    cfg = quantize_np._copy_side_files(src, dst)
    L, D, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    std = cfg.get("initializer_range", 0.02)
    rng = np.random.default_rng(seed)
    template = {}  # suffix -> tensor of the latest main layer holding it
    for l in range(L):
        pre = f"model.layers.{l}."
        for k, t in T.items():
            if k.startswith(pre):
                template[k[len(pre):]] = t
    extra = {"enorm.weight": ("BF16", [D]), "hnorm.weight": ("BF16", [D]), "eh_proj.weight": ("BF16", [D, 2 * D]),
             "shared_head.norm.weight": ("BF16", [D])}
    if copies:
        extra["embed_tokens.weight"] = ("BF16", [V, D])
        extra["shared_head.head.weight"] = ("BF16", [V, D])
    specs = {k: (t.dtype, t.shape) for k, t in template.items()}
    specs.update(extra)
    out = dict(T)
    for suffix in sorted(specs):
        dtype, shape = specs[suffix]
        if suffix.endswith("norm.weight") or "layernorm" in suffix:
            v = 1 + 0.2 * rng.standard_normal(shape)
        elif suffix.endswith("k_norm.bias"):
            v = 0.2 * rng.standard_normal(shape)
        elif "e_score_correction_bias" in suffix:
            v = 0.05 * rng.standard_normal(shape)
        else:
            v = std * rng.standard_normal(shape)
        out[f"model.layers.{L}.{suffix}"] = quantize_np.from_np(v.astype(np.float32), dtype)
    cfg["num_nextn_predict_layers"] = 1
    quantize_np.write_safetensors(os.path.join(dst, "model.safetensors"), out, meta or {"format": "pt"})
    quantize_np._write_config(dst, cfg)
    return len(out) - len(T)


def classes(arch):
    import transformers as T
    return {"glm": (T.GlmMoeDsaConfig, T.GlmMoeDsaForCausalLM),
            "v32": (T.DeepseekV32Config, T.DeepseekV32ForCausalLM),
            "v3": (T.DeepseekV3Config, T.DeepseekV3ForCausalLM)}[arch]


def build(name, out_dir, seed=None):
    import torch
    arch, kw, default_seed = MODELS[name]
    seed = default_seed if seed is None else seed
    C, M = classes(arch)
    cfg = C(**kw)
    torch.manual_seed(seed)
    model = M(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or "layernorm" in n or "k_norm.weight" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            if n.endswith("k_norm.bias"):
                p.copy_(0.2 * torch.randn_like(p))
        bias = {}
        for n, b in model.named_buffers():
            if "e_score_correction_bias" in n:
                b.copy_(0.05 * torch.randn_like(b))
                bias[n] = b.detach().clone()
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n in bias:
                b.data = bias[n].clone()  # fp32, as in real checkpoints
    d = os.path.join(out_dir, name)
    model.save_pretrained(d)
    with open(os.path.join(d, "config.json")) as f:
        saved = json.load(f)
    return d, seed, saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/models")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--seed", type=int, help="override the seed (with --only)")
    ap.add_argument("--no-quant", action="store_true")
    a = ap.parse_args()
    names = a.only or list(MODELS) + list(QUANT) + list(MTP) + list(QUANT_MTP)
    if any(n in MODELS for n in names):
        import torch
        import transformers
        print("torch", torch.__version__, "transformers", transformers.__version__)
    for name in names:
        if name in MODELS:
            d, seed, _ = build(name, a.out, a.seed)
            print(f"built {d} seed {seed}")
    stages = ([QUANT] if not a.no_quant else []) + [MTP] + ([QUANT_MTP] if not a.no_quant else [])
    for stage in stages:
        for name in names:
            if stage is MTP and name in MTP:
                src, seed, copies = MTP[name]
                n = add_mtp_layer(os.path.join(a.out, src), os.path.join(a.out, name), seed, copies)
                print(f"MTP layer {os.path.join(a.out, src)} -> {os.path.join(a.out, name)} ({n} tensors, seed {seed})")
                continue
            if stage is not MTP and name in stage:
                kind, src = stage[name]
                s, d = os.path.join(a.out, src), os.path.join(a.out, name)
                n = quantize_np.quantize_dir_mxfp4(s, d) if kind == "mxfp4" else quantize_np.quantize_dir_fp8(s, d)
                print(f"quantized {s} -> {d} ({kind}, {n} tensors)")


if __name__ == "__main__":
    main()
