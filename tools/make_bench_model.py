#!/usr/bin/env python3
"""Random-weight glm_moe_dsa checkpoints for bench/decode_bench (numpy + the safetensors codec of quantize_np.py;
no torch). Not committed: bench/README.md says how to make them.

  build/venv/bin/python tools/make_bench_model.py [--out build/bench-models] [--seed 0]
      [--shape glm5|deepseek_v3|all|glm5-full|deepseek-v3-fp8|deepseek-v3-bf16] [--fast] [--mtp]

Writes two model directories per shape (the tensor layout of the tiny test models, larger dimensions):
  <shape>-bench-bf16    every tensor bf16 (e_score_correction_bias fp32)
  <shape>-bench-mxfp4   the same weights with the routed experts quantized to Quark MXFP4 by
                        tools/quantize_np.quantize_dir_mxfp4 (U8 weight [out, in/2] + U8 weight_scale [out, in/32],
                        quantization_config quant_method quark with its exclude list)

Shapes:
  glm5 (default; glm5-bench-*, ~83 M parameters, ~40 M active per token): glm_moe_dsa, hidden 1024, 8 layers
      (layer 0 dense, intermediate 1024), 16 routed experts top-4 + 1 shared, moe_intermediate 128, vocab 8192,
      q_lora 384, kv_lora 256, 8 heads, dn 64 dr 32 dv 64, indexer 8 heads x 64, index_topk 256.
  deepseek_v3 (v3-bench-*): the shape of the CPU comparison against the llama.cpp family (issue 17): deepseek_v3,
      hidden 1024, 8 layers (layer 0 dense, intermediate 1024), 16 heads, q_lora 384, kv_lora 512, dn = dr = dv =
      64, 32 routed experts top-4 + 1 shared, moe_intermediate 256, vocab 32000, untied lm_head, no indexer.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quantize_np as qn  # noqa: E402

CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "torch_dtype": "bfloat16",
    "vocab_size": 8192, "hidden_size": 1024, "intermediate_size": 1024, "moe_intermediate_size": 128,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
    "q_lora_rank": 384, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
    "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1,
    "index_n_heads": 8, "index_head_dim": 64, "index_topk": 256,
    "indexer_types": ["full"] * 8,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "initializer_range": 0.02,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "attention_bias": False,
    "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
    "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 1024, "moe_intermediate_size": 256,
    "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
    "q_lora_rank": 384, "kv_lora_rank": 512, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64,
    "head_dim": 64, "qk_head_dim": 128,
    "n_routed_experts": 32, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "initializer_range": 0.02,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "attention_bias": False,
    "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1, "rope_interleave": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

SHAPES = {"glm5": ("glm5-bench", CONFIG), "deepseek_v3": ("v3-bench", V3_CONFIG)}

# The GLM-5 shape of the GPU benchmark (docs/cuda.md §benchmarks): the real per-layer shapes truncated to 3 dense + 5
# MoE layers, routed experts MXFP4 (Quark layout), everything else bf16; ~34 GB, written streaming (never held in
# memory) with random bytes: bf16 values with bounded exponents (|w| in [2^-13, 2^-6)), random e2m1 nibbles with
# e8m0 scales 2^-9 .. 2^-7. At batch 1 the bytes a decode step reads do not depend on the values.
GLM5_FULL = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "torch_dtype": "bfloat16",
    "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288, "moe_intermediate_size": 2048,
    "num_hidden_layers": 8, "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 3,
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
    "indexer_types": ["full"] * 8,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 202752, "initializer_range": 0.02,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "attention_bias": False,
    "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}


# The DeepSeek-V3 shapes of the GPU benchmark: hidden 7168, 128 heads, q_lora 1536, dn 128 / dr 64 / dv 128,
# kv_lora 512, 256 experts top-8 in 8 groups (topk_group 4, sigmoid, noaux_tc), moe_intermediate 2048, dense
# intermediate 18432, vocab 129,280, untied lm_head, + 1 shared expert.
#   deepseek-v3-fp8: truncated to 3 dense + 2 MoE layers, block-FP8 weights as DeepSeek ships them (e4m3 codes +
#     weight_scale_inv [ceil(rows/128), ceil(cols/128)] fp32; embedding, lm_head, norms and the router bf16,
#     e_score_correction_bias fp32), quantization_config fp8 / e4m3 / dynamic activations / 128x128 blocks (~28 GB).
#   deepseek-v3-bf16: 4 layers (layer 0 dense, then 3 MoE layers of 64 routed experts top-8, n_group 8,
#     topk_group 4), every tensor bf16 (e_score_correction_bias fp32), plain RoPE theta 10000 (~23.2 GB): the
#     checkpoint of the llama.cpp-family comparison of the GPU decode issue.
V3_FULL = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 5, "num_attention_heads": 128, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "head_dim": 64, "qk_head_dim": 192,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 3, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "rms_norm_eps": 1e-6, "max_position_embeddings": 163840, "initializer_range": 0.02,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "attention_bias": False,
    "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1, "rope_interleave": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
V3_FP8_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
V3_BF16_4L = dict(V3_FULL, num_hidden_layers=4, first_k_dense_replace=1, n_routed_experts=64)


def v3_specs(c, fp8):
    """(name, kind, shape) of every tensor of a DeepSeek-V3-shape checkpoint, in file order; fp8: block-FP8 linears
    (each followed by its weight_scale_inv)."""
    D, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    H, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    dq, dc, E, Im, I = c["q_lora_rank"], c["kv_lora_rank"], c["n_routed_experts"], c["moe_intermediate_size"], \
        c["intermediate_size"]

    def lin(name, rows, cols):
        if not fp8:
            return [(name + ".weight", "BF16", [rows, cols])]
        return [(name + ".weight", "F8", [rows, cols]),
                (name + ".weight_scale_inv", "SCALEF32", [(rows + 127) // 128, (cols + 127) // 128])]
    S = [("model.embed_tokens.weight", "BF16", [V, D]), ("lm_head.weight", "BF16", [V, D]),
         ("model.norm.weight", "NORM", [D])]
    for l in range(L):
        p, a = f"model.layers.{l}.", f"model.layers.{l}.self_attn."
        S += [(p + "input_layernorm.weight", "NORM", [D]), (p + "post_attention_layernorm.weight", "NORM", [D])]
        S += lin(a + "q_a_proj", dq, D) + lin(a + "q_b_proj", H * (dn + dr), dq)
        S += lin(a + "kv_a_proj_with_mqa", dc + dr, D) + lin(a + "kv_b_proj", H * (dn + dv), dc)
        S += lin(a + "o_proj", D, H * dv)
        S += [(a + "q_a_layernorm.weight", "NORM", [dq]), (a + "kv_a_layernorm.weight", "NORM", [dc])]
        m = p + "mlp."
        mlp = lambda q, inter: lin(q + "gate_proj", inter, D) + lin(q + "up_proj", inter, D) + \
            lin(q + "down_proj", D, inter)
        if l < c["first_k_dense_replace"]:
            S += mlp(m, I)
        else:
            S += [(m + "gate.weight", "BF16", [E, D]), (m + "gate.e_score_correction_bias", "F32", [E])]
            for e in range(E):
                S += mlp(f"{m}experts.{e}.", Im)
            S += mlp(m + "shared_experts.", Im * c["n_shared_experts"])
    return S


def full_layer_specs(c, l):
    """(name, dtype, shape) of decoder layer l of the GLM-5-shape checkpoint (l = num_hidden_layers: its MTP layer,
    a MoE block with its own indexer, then enorm, hnorm, eh_proj and shared_head.norm; the embedding and the head
    are the main model's, as GLM-5 stores them)."""
    D, L = c["hidden_size"], c["num_hidden_layers"]
    H, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    dq, dc, E, Im, I = c["q_lora_rank"], c["kv_lora_rank"], c["n_routed_experts"], c["moe_intermediate_size"], \
        c["intermediate_size"]
    nI, dI = c["index_n_heads"], c["index_head_dim"]
    p, a = f"model.layers.{l}.", f"model.layers.{l}.self_attn."
    S = [(p + "input_layernorm.weight", "NORM", [D]), (p + "post_attention_layernorm.weight", "NORM", [D]),
         (a + "q_a_proj.weight", "BF16", [dq, D]), (a + "q_b_proj.weight", "BF16", [H * (dn + dr), dq]),
         (a + "kv_a_proj_with_mqa.weight", "BF16", [dc + dr, D]),
         (a + "kv_b_proj.weight", "BF16", [H * (dn + dv), dc]), (a + "o_proj.weight", "BF16", [D, H * dv]),
         (a + "q_a_layernorm.weight", "NORM", [dq]), (a + "kv_a_layernorm.weight", "NORM", [dc]),
         (a + "indexer.wq_b.weight", "BF16", [nI * dI, dq]), (a + "indexer.wk.weight", "BF16", [dI, D]),
         (a + "indexer.weights_proj.weight", "BF16", [nI, D]), (a + "indexer.k_norm.weight", "NORM", [dI]),
         (a + "indexer.k_norm.bias", "BIAS", [dI])]
    m = p + "mlp."
    mlp = lambda q, inter: [(q + "gate_proj.weight", "BF16", [inter, D]), (q + "up_proj.weight", "BF16", [inter, D]),
                            (q + "down_proj.weight", "BF16", [D, inter])]
    if l < c["first_k_dense_replace"]:
        S += mlp(m, I)
    else:
        S += [(m + "gate.weight", "BF16", [E, D]), (m + "gate.e_score_correction_bias", "F32", [E])]
        for e in range(E):
            q = f"{m}experts.{e}."
            for n, (r, k) in (("gate_proj", (Im, D)), ("up_proj", (Im, D)), ("down_proj", (D, Im))):
                S += [(q + n + ".weight", "U8", [r, k // 2]), (q + n + ".weight_scale", "SCALE", [r, k // 32])]
        S += mlp(m + "shared_experts.", Im * c["n_shared_experts"])
    if l >= L:
        S += [(p + "enorm.weight", "NORM", [D]), (p + "hnorm.weight", "NORM", [D]),
              (p + "eh_proj.weight", "BF16", [D, 2 * D]), (p + "shared_head.norm.weight", "NORM", [D])]
    return S


def full_specs(c, mtp=0):
    """(name, dtype, shape) of every tensor of the GLM-5-shape checkpoint, in file order; the mtp MTP layers come
    last, so that the main tensors' bytes do not depend on them (the random stream reaches them first)."""
    D, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    S = [("model.embed_tokens.weight", "BF16", [V, D]), ("lm_head.weight", "BF16", [V, D]),
         ("model.norm.weight", "NORM", [D])]
    for l in range(L + mtp):
        S += full_layer_specs(c, l)
    return S


def random_bytes(kind, shape, rng):
    n = int(np.prod(shape))
    if kind == "BF16":  # sign | exponent 114..120 | mantissa
        b = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        e = rng.integers(114, 121, size=n, dtype=np.uint16)
        return ((b & np.uint16(0x807F)) | (e << np.uint16(7))).tobytes()
    if kind == "F8":  # e4m3fn codes with exponent 1..14 (no NaN 0x7F / 0xFF)
        b = rng.integers(0, 256, size=n, dtype=np.uint8)
        e = rng.integers(1, 15, size=n, dtype=np.uint8)
        return ((b & np.uint8(0x87)) | (e << np.uint8(3))).tobytes()
    if kind == "SCALEF32":  # block scales 2^-10 .. 2^-6
        return (2.0 ** rng.uniform(-10.0, -6.0, size=n)).astype("<f4").tobytes()
    if kind == "NORM":
        return qn.f32_to_bf16_bits(1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.uint16).tobytes()
    if kind == "BIAS":
        return qn.f32_to_bf16_bits(0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.uint16).tobytes()
    if kind == "F32":
        return (0.05 * rng.standard_normal(n, dtype=np.float32)).astype("<f4").tobytes()
    if kind == "U8":
        return rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
    return rng.integers(118, 121, size=n, dtype=np.uint8).tobytes()  # SCALE: e8m0 2^-9 .. 2^-7


KIND_BYTES = {"BF16": 2, "NORM": 2, "BIAS": 2, "F32": 4, "U8": 1, "SCALE": 1, "F8": 1, "SCALEF32": 4}
KIND_DTYPE = {"BF16": "BF16", "NORM": "BF16", "BIAS": "BF16", "F32": "F32", "U8": "U8", "SCALE": "U8",
              "F8": "F8_E4M3", "SCALEF32": "F32"}
POOL_BYTES = 64 << 20


class FastBytes:
    """Random bytes of a kind, fast: large tensors are slices of a 64 MB random pool per kind taken at random
    offsets (each tensor different, none all-equal; what a decode step reads does not depend on the values), small
    ones drawn fresh."""

    def __init__(self, rng):
        self.rng, self.pools = rng, {}

    def __call__(self, kind, shape):
        nb = int(np.prod(shape)) * KIND_BYTES[kind]
        if nb < (1 << 20) or kind in ("NORM", "BIAS", "F32"):
            return random_bytes(kind, shape, self.rng)
        if kind not in self.pools:
            w = KIND_BYTES[kind]
            self.pools[kind] = random_bytes(kind, [POOL_BYTES // w], self.rng) * 2
        pool, w = self.pools[kind], KIND_BYTES[kind]
        out = bytearray()
        while len(out) < nb:
            take = min(nb - len(out), POOL_BYTES)
            off = int(self.rng.integers(0, POOL_BYTES // w)) * w
            out += pool[off:off + take]
        return bytes(out)


def write_streaming(d, config, specs, seed, fast):
    """Writes model.safetensors (specs in order, never held whole in memory) and config.json into d."""
    rng = np.random.default_rng(seed)
    gen = FastBytes(rng) if fast else (lambda kind, shape: random_bytes(kind, shape, rng))
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, kind, shape in specs:
        nb = int(np.prod(shape)) * KIND_BYTES[kind]
        hdr[name] = {"dtype": KIND_DTYPE[kind], "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    os.makedirs(d, exist_ok=True)
    h = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for name, kind, shape in specs:
            f.write(gen(kind, shape))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {d}: {off / 1e9:.1f} GB")


def write_full(out, seed, fast=False, mtp=False):
    c = dict(GLM5_FULL)
    c["quantization_config"] = qn.quark_mxfp4_config("floor")
    c["quantization_config"]["exclude"] += [f"re:model.layers.{l}.*" for l in range(1, c["first_k_dense_replace"])]
    name = "glm5-shape-mxfp4"
    if mtp:  # the same main tensors (same seed, same order) and one MTP layer after them (its eh_proj bf16)
        c["num_nextn_predict_layers"] = 1
        c["quantization_config"]["exclude"].append("re:.*eh_proj$")
        name += "-mtp"
    write_streaming(os.path.join(out, name), c, full_specs(GLM5_FULL, 1 if mtp else 0), seed, fast)


def write_v3(out, seed, fp8, fast=False):
    c = dict(V3_FULL if fp8 else V3_BF16_4L)
    if fp8:
        c["quantization_config"] = dict(V3_FP8_CONFIG)
    name = "deepseek-v3-shape-fp8" if fp8 else "deepseek-v3-shape-bf16"
    write_streaming(os.path.join(out, name), c, v3_specs(c, fp8), seed, fast)


def build_tensors(c, rng):
    D, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    H, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    dq, dc = c["q_lora_rank"], c["kv_lora_rank"]
    E, Im, I = c["n_routed_experts"], c["moe_intermediate_size"], c["intermediate_size"]
    nI, dI = c.get("index_n_heads", 0), c.get("index_head_dim", 0)
    std = c["initializer_range"]
    T = {}

    def lin(name, rows, cols):
        T[name] = qn.from_np(rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std), "BF16")

    def norm(name, n):
        T[name] = qn.from_np(1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32), "BF16")

    def mlp(p, inter):
        lin(p + "gate_proj.weight", inter, D)
        lin(p + "up_proj.weight", inter, D)
        lin(p + "down_proj.weight", D, inter)

    lin("model.embed_tokens.weight", V, D)
    lin("lm_head.weight", V, D)
    norm("model.norm.weight", D)
    for l in range(L):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        norm(p + "input_layernorm.weight", D)
        norm(p + "post_attention_layernorm.weight", D)
        lin(a + "q_a_proj.weight", dq, D)
        lin(a + "q_b_proj.weight", H * (dn + dr), dq)
        lin(a + "kv_a_proj_with_mqa.weight", dc + dr, D)
        lin(a + "kv_b_proj.weight", H * (dn + dv), dc)
        lin(a + "o_proj.weight", D, H * dv)
        norm(a + "q_a_layernorm.weight", dq)
        norm(a + "kv_a_layernorm.weight", dc)
        if c.get("indexer_types", ["none"] * L)[l] == "full":
            ip = a + "indexer."
            lin(ip + "wq_b.weight", nI * dI, dq)
            lin(ip + "wk.weight", dI, D)
            lin(ip + "weights_proj.weight", nI, D)
            norm(ip + "k_norm.weight", dI)
            T[ip + "k_norm.bias"] = qn.from_np(0.1 * rng.standard_normal(dI, dtype=np.float32), "BF16")
        m = p + "mlp."
        if l < c["first_k_dense_replace"]:
            mlp(m, I)
        else:
            lin(m + "gate.weight", E, D)
            T[m + "gate.e_score_correction_bias"] = qn.from_np(
                0.05 * rng.standard_normal(E, dtype=np.float32), "F32")
            for e in range(E):
                mlp(f"{m}experts.{e}.", Im)
            mlp(m + "shared_experts.", Im * c["n_shared_experts"])
    return T


def write_shape(out, prefix, config, seed):
    rng = np.random.default_rng(seed)
    T = build_tensors(config, rng)
    n_params = sum(int(np.prod(t.shape)) for t in T.values())
    bf = os.path.join(out, prefix + "-bf16")
    os.makedirs(bf, exist_ok=True)
    qn.write_safetensors(os.path.join(bf, "model.safetensors"), T, {"format": "pt"})
    with open(os.path.join(bf, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {bf}: {n_params / 1e6:.1f} M parameters")
    mx = os.path.join(out, prefix + "-mxfp4")
    n = qn.quantize_dir_mxfp4(bf, mx)
    print(f"wrote {mx}: {n} routed-expert tensors quantized to MXFP4")


def add_tokenizer(model_dir, src):
    """Copies the tokenizer of src (tokenizer.json, its config, chat template, generation config) into model_dir with
    the BPE vocabulary padded by filler tokens ("Ġfill<id>") up to the model's vocab_size, so that `latent serve` can
    run the random-weight model: every id the model may sample decodes to text (serving benchmarks)."""
    import shutil
    with open(os.path.join(model_dir, "config.json")) as f:
        V = json.load(f)["vocab_size"]
    with open(os.path.join(src, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    top = max(list(vocab.values()) + [t["id"] for t in tok.get("added_tokens", [])])
    if top >= V:
        raise SystemExit(f"{src}: tokenizer ids up to {top} do not fit the model's vocab_size {V}")
    for i in range(top + 1, V):
        vocab[f"\u0120fill{i}"] = i
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    for name in ("tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(model_dir, name))
    print(f"tokenizer of {src} into {model_dir} ({V - top - 1} filler tokens)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/bench-models")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES) + ["all", "glm5-full", "deepseek-v3-fp8", "deepseek-v3-bf16"],
                    default="glm5",
                    help="glm5-full: the GLM-5 shape of the GPU benchmark (~34 GB, MXFP4 experts); deepseek-v3-fp8 "
                         "(~28 GB, block FP8) / deepseek-v3-bf16 (4 layers, 64 experts, ~23 GB): DeepSeek-V3 shapes")
    ap.add_argument("--fast", action="store_true",
                    help="large tensors as slices of a random pool (disk-speed writing; values still random)")
    ap.add_argument("--mtp", action="store_true",
                    help="glm5-full only: also one MTP layer (num_nextn_predict_layers 1; model.layers.8: a MoE block "
                         "with its indexer, enorm, hnorm, eh_proj, shared_head.norm) after the unchanged main tensors, "
                         "into glm5-shape-mxfp4-mtp (speculative decoding: cuda_bench verify)")
    ap.add_argument("--tokenizer", metavar="DIR", default="",
                    help="also copy DIR's tokenizer into every written model, its vocabulary padded to the model's "
                         "(e.g. models/latent-demo: lets `latent serve` run the bench model)")
    a = ap.parse_args()
    if a.mtp and a.shape != "glm5-full":
        ap.error("--mtp is supported for --shape glm5-full only")
    before = set(os.listdir(a.out)) if os.path.isdir(a.out) else set()
    if a.shape == "glm5-full":
        write_full(a.out, a.seed, a.fast, a.mtp)
    elif a.shape.startswith("deepseek-v3-"):
        write_v3(a.out, a.seed, a.shape.endswith("fp8"), a.fast)
    else:
        for name in sorted(SHAPES) if a.shape == "all" else [a.shape]:
            prefix, config = SHAPES[name]
            write_shape(a.out, prefix, config, a.seed)
    if a.tokenizer:
        for d in sorted(set(os.listdir(a.out)) - before) or sorted(os.listdir(a.out)):
            if os.path.exists(os.path.join(a.out, d, "config.json")):
                add_tokenizer(os.path.join(a.out, d), a.tokenizer)


if __name__ == "__main__":
    main()
