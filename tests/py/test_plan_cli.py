"""`latent plan` end to end: the precision plan of the committed tiny models, the --quantize guard, and a corpus of
malformed checkpoints that must each give a one-line error naming the file or tensor and a non-zero exit.

Runs the binary named by $LATENT_BIN (set by ctest; the ASan build runs the same file)."""
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "models"
LATENT = os.environ.get("LATENT_BIN", str(ROOT / "build" / "ci" / "latent"))


def run(*args, check=None):
    p = subprocess.run([LATENT, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check is not None:
        assert (p.returncode == 0) == check, f"exit {p.returncode}\nstdout:{p.stdout[-2000:]}\nstderr:{p.stderr[-2000:]}"
    return p


# ---------------------------------------------------------------------------------------------------------------
# A tiny hand-written checkpoint (no torch needed): a glm_moe_dsa config and a few tensors.
# ---------------------------------------------------------------------------------------------------------------

CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
    "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1,
    "index_n_heads": 4, "index_head_dim": 32, "index_topk": 8, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 128, "tie_word_embeddings": False, "num_nextn_predict_layers": 0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

ST_DTYPES = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "F16": 2}


def tensor(dtype, shape, data=None):
    n = int(np.prod(shape)) if shape else 1
    nbytes = n * ST_DTYPES[dtype]
    if data is None:
        rng = np.random.default_rng(n)
        if dtype == "F32":
            data = (rng.standard_normal(n).astype(np.float32) * 0.1 + 1).tobytes()
        elif dtype == "BF16":
            f = rng.standard_normal(n).astype(np.float32) * 0.1
            data = (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        elif dtype == "F8_E8M0":
            data = bytes([120] * n)
        else:
            data = rng.integers(0, 255, n, dtype=np.uint8).tobytes()[:nbytes]
    assert len(data) == nbytes, (dtype, shape, len(data), nbytes)
    return {"dtype": dtype, "shape": list(shape), "data": data}


def base_tensors(fp8=False, mxfp4=True):
    """Every tensor of CONFIG: layer 0 dense, layer 1 MoE (routed and shared experts MXFP4, FP8 or bf16)."""
    t = {"model.embed_tokens.weight": tensor("BF16", [64, 64]), "model.norm.weight": tensor("BF16", [64]),
         "lm_head.weight": tensor("BF16", [64, 64])}

    def linear(name, o, i, quantized=False):
        if quantized and fp8:
            t[name + ".weight"] = tensor("F8_E4M3", [o, i], bytes([0x38] * (o * i)))
            t[name + ".weight_scale_inv"] = tensor("F32", [1, 1], np.float32([0.01]).tobytes())
        elif quantized and mxfp4:
            t[name + ".weight"] = tensor("U8", [o, i // 2])
            t[name + ".weight_scale"] = tensor("U8", [o, i // 32], bytes([120] * (o * i // 32)))
        else:
            t[name + ".weight"] = tensor("BF16", [o, i])

    for l in range(2):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = tensor("BF16", [64])
        t[p + "post_attention_layernorm.weight"] = tensor("BF16", [64])
        a = p + "self_attn."
        for name, (o, i) in {"q_a_proj": (32, 64), "q_b_proj": (2 * 32, 32), "kv_a_proj_with_mqa": (32 + 16, 64),
                             "kv_b_proj": (2 * 32, 32), "o_proj": (64, 2 * 16), "indexer.wq_b": (4 * 32, 32),
                             "indexer.wk": (32, 64), "indexer.weights_proj": (4, 64)}.items():
            linear(a + name, o, i)
        t[a + "q_a_layernorm.weight"] = tensor("BF16", [32])
        t[a + "kv_a_layernorm.weight"] = tensor("BF16", [32])
        t[a + "indexer.k_norm.weight"] = tensor("BF16", [32])
        t[a + "indexer.k_norm.bias"] = tensor("BF16", [32])
    for proj, (o, i) in {"gate_proj": (128, 64), "up_proj": (128, 64), "down_proj": (64, 128)}.items():
        linear("model.layers.0.mlp." + proj, o, i)
    t["model.layers.1.mlp.gate.weight"] = tensor("BF16", [4, 64])
    t["model.layers.1.mlp.gate.e_score_correction_bias"] = tensor("F32", [4])
    for e in [*range(4), "shared"]:
        p = "model.layers.1.mlp.shared_experts." if e == "shared" else f"model.layers.1.mlp.experts.{e}."
        for proj, (o, i) in {"gate_proj": (32, 64), "up_proj": (32, 64), "down_proj": (64, 32)}.items():
            linear(p + proj, o, i, quantized=True)
    return t


def write_st(path, tensors, header_override=None, raw_tail=b""):
    header, blob, off = {}, b"", 0
    for name, t in tensors.items():
        header[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [off, off + len(t["data"])]}
        blob += t["data"]
        off += len(t["data"])
    if header_override is not None:
        header = header_override(header)
    hj = header if isinstance(header, (bytes, str)) else json.dumps(header)
    hb = hj.encode() if isinstance(hj, str) else hj
    Path(path).write_bytes(struct.pack("<Q", len(hb)) + hb + blob + raw_tail)


def make_model(d, tensors=None, config=None, qc="quark"):
    d.mkdir(parents=True, exist_ok=True)
    cfg = dict(CONFIG if config is None else config)
    if qc == "quark":
        cfg["quantization_config"] = {"quant_method": "quark",
                                      "exclude": ["lm_head", "re:.*mlp.gate$", "re:.*self_attn.*",
                                                  "re:model.layers.0.*", "re:.*eh_proj$"]}
    elif qc == "fp8":
        cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (d / "config.json").write_text(json.dumps(cfg))
    write_st(d / "model.safetensors", base_tensors() if tensors is None else tensors)
    return d


def test_handmade_checkpoint_plans(tmp_path):
    d = make_model(tmp_path / "m")
    p = run("plan", "--model", d, "--json", check=True)
    plan = {o["name"]: o for o in json.loads(p.stdout)}
    assert plan["model.layers.1.mlp.experts.3.down_proj.weight"]["stored"] == "mxfp4"
    assert plan["model.layers.1.mlp.experts.3.down_proj.weight"]["shape"] == [64, 32]
    assert plan["model.layers.0.self_attn.kv_b_proj.weight"]["stored"] == "bf16"
    # The CUDA backend's device layout: MXFP4 codes pair-swizzled (a bit order, values unchanged), the rest as stored.
    assert plan["model.layers.1.mlp.experts.3.down_proj.weight"]["cuda_layout"] == "mxfp4_pair_swizzled"
    assert plan["model.layers.0.self_attn.kv_b_proj.weight"]["cuda_layout"] == "as_stored"
    assert "model.layers.1.mlp.experts.0.up_proj.weight_scale" not in plan  # companions fold into their weight
    assert p.stderr == ""  # config and tensors agree: no warning
    text = run("plan", "--model", d, check=True).stdout
    assert "model.layers.1.mlp.experts.*.{gate,up,down}_proj.weight" in text
    assert "mxfp4 (quark, e8m0/32)" in text
    assert "cuda layout" in text and "pair-swizzled" in text
    assert "tile-major" not in text  # no MXFP4 weight here has whole 16-row tiles of 128-column chunks


def test_bundled_model_experts_tile_major_on_cuda():
    # The demo model's routed experts ([256, 128] and [128, 256] MXFP4): whole 16-row tiles of 128-column chunks, so
    # the CUDA backend also stores their code bytes tile-major (mx_layout.h); the plan says so per tensor and in all.
    p = run("plan", "--json", check=True)
    plan = {o["name"]: o for o in json.loads(p.stdout)}
    down = plan["model.layers.1.mlp.experts.0.down_proj.weight"]
    assert down["shape"] == [256, 128] and down["cuda_layout"] == "mxfp4_pair_swizzled_tile_major"
    assert plan["model.layers.1.mlp.experts.0.up_proj.weight"]["cuda_layout"] == "mxfp4_pair_swizzled_tile_major"
    assert all(o["cuda_layout"] == "as_stored" for o in plan.values() if o["stored"] != "mxfp4")
    text = run("plan", check=True).stdout
    line = next(l for l in text.splitlines() if l.startswith("cuda layout"))
    n = sum(o["cuda_layout"] == "mxfp4_pair_swizzled_tile_major" for o in plan.values() if not o["skipped"])
    assert n > 0 and f"{n} of them with their code bytes in tile-major order" in line


def test_config_disagreement_is_a_warning(tmp_path):
    t = base_tensors(mxfp4=False)  # experts bf16 although quark does not exclude them
    d = make_model(tmp_path / "m", t)
    p = run("plan", "--model", d, "--json", check=True)
    assert "model.layers.1.mlp.experts.0.gate_proj" in p.stderr and "warning" in p.stderr
    plan = {o["name"]: o for o in json.loads(p.stdout)}
    assert plan["model.layers.1.mlp.experts.0.gate_proj.weight"]["stored"] == "bf16"
    assert plan["model.layers.1.mlp.experts.0.gate_proj.weight"]["compute"] == "bf16"


def test_fp8_block_checkpoint(tmp_path):
    d = make_model(tmp_path / "m", base_tensors(fp8=True), qc="fp8")
    plan = {o["name"]: o for o in json.loads(run("plan", "--model", d, "--json", check=True).stdout)}
    e = plan["model.layers.1.mlp.experts.2.gate_proj.weight"]
    assert e["stored"] == "fp8_e4m3_block128" and e["transform"] == "none"
    assert e["companions"] == ["model.layers.1.mlp.experts.2.gate_proj.weight_scale_inv"]


# ---------------------------------------------------------------------------------------------------------------
# Malformed checkpoints: each must fail with one line naming the file or tensor, exit code 1, no crash.
# ---------------------------------------------------------------------------------------------------------------

def _st(d):
    return d / "model.safetensors"


def m_truncated(d):
    make_model(d)
    b = _st(d).read_bytes()
    _st(d).write_bytes(b[:5])
    return "model.safetensors"


def m_header_past_eof(d):
    make_model(d)
    b = _st(d).read_bytes()
    _st(d).write_bytes(struct.pack("<Q", len(b) * 10) + b[8:])
    return "model.safetensors"


def m_truncated_data(d):
    make_model(d)
    b = _st(d).read_bytes()
    _st(d).write_bytes(b[:-100])
    return "model.safetensors"


def m_bad_json(d):
    make_model(d)
    write_st(_st(d), {}, header_override=lambda h: b'{"a": [1, 2')
    return "model.safetensors"


def m_header_not_object(d):
    make_model(d)
    write_st(_st(d), {}, header_override=lambda h: b"[1, 2, 3]")
    return "model.safetensors"


def m_overlap(d):
    make_model(d)
    def ov(h):
        h["model.norm.weight"]["data_offsets"] = list(h["model.embed_tokens.weight"]["data_offsets"])
        h["model.norm.weight"]["data_offsets"][1] = h["model.norm.weight"]["data_offsets"][0] + 128
        return h
    write_st(_st(d), base_tensors(), header_override=ov)
    return "model.norm.weight"


def m_wrong_size(d):
    make_model(d)
    def ws(h):
        h["model.norm.weight"]["shape"] = [65]
        return h
    write_st(_st(d), base_tensors(), header_override=ws)
    return "model.norm.weight"


def m_unknown_dtype(d):
    make_model(d)
    def ud(h):
        h["model.norm.weight"]["dtype"] = "Q4_K"
        return h
    write_st(_st(d), base_tensors(), header_override=ud)
    return "model.norm.weight"


def m_duplicate_name(d):
    make_model(d)
    hdr = {"model.norm.weight": {"dtype": "BF16", "shape": [64], "data_offsets": [0, 128]}}
    hj = json.dumps(hdr)[:-1] + ', "model.norm.weight": {"dtype": "BF16", "shape": [64], "data_offsets": [128, 256]}}'
    write_st(_st(d), {}, header_override=lambda h: hj.encode(), raw_tail=bytes(256))
    return "model.norm.weight"


def m_negative_shape(d):
    make_model(d)
    def ns(h):
        h["model.norm.weight"]["shape"] = [-64]
        return h
    write_st(_st(d), base_tensors(), header_override=ns)
    return "model.norm.weight"


def m_offsets_past_data(d):
    make_model(d)
    def op(h):
        h["lm_head.weight"]["data_offsets"] = [10 ** 9, 10 ** 9 + 8192]
        return h
    write_st(_st(d), base_tensors(), header_override=op)
    return "lm_head.weight"


def _sharded(d, drop_shard=False, index_extra=None, index_json=None):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({**CONFIG, "quantization_config": {
        "quant_method": "quark", "exclude": ["lm_head", "re:.*mlp.gate$", "re:.*self_attn.*", "re:model.layers.0.*"]}}))
    t = base_tensors()
    names = sorted(t)
    a, b = names[: len(names) // 2], names[len(names) // 2:]
    write_st(d / "model-00001-of-00002.safetensors", {n: t[n] for n in a})
    if not drop_shard:
        write_st(d / "model-00002-of-00002.safetensors", {n: t[n] for n in b})
    wm = {n: "model-00001-of-00002.safetensors" for n in a} | {n: "model-00002-of-00002.safetensors" for n in b}
    if index_extra:
        wm.update(index_extra)
    (d / "model.safetensors.index.json").write_text(index_json if index_json is not None else json.dumps({"weight_map": wm}))


def m_missing_shard(d):
    _sharded(d, drop_shard=True)
    return "model-00002-of-00002.safetensors"


def m_index_missing_tensor(d):
    _sharded(d, index_extra={"model.layers.0.mlp.extra_proj.weight": "model-00001-of-00002.safetensors"})
    return "model.layers.0.mlp.extra_proj.weight"


def m_index_bad_json(d):
    _sharded(d, index_json="{not json")
    return "model.safetensors.index.json"


def m_missing_scale(d):
    t = base_tensors()
    del t["model.layers.1.mlp.experts.2.up_proj.weight_scale"]
    make_model(d, t)
    return "model.layers.1.mlp.experts.2.up_proj"


def m_scale_shape(d):
    t = base_tensors()
    t["model.layers.1.mlp.experts.1.down_proj.weight_scale"] = tensor("U8", [64, 2], bytes([120] * 128))
    make_model(d, t)
    return "model.layers.1.mlp.experts.1.down_proj.weight_scale"


def m_nan_e8m0(d):
    t = base_tensors()
    s = bytearray([120] * 64)
    s[17] = 0xFF
    t["model.layers.1.mlp.experts.0.gate_proj.weight_scale"] = tensor("U8", [32, 2], bytes(s))
    make_model(d, t)
    return "model.layers.1.mlp.experts.0.gate_proj.weight_scale"


def m_fp8_nan_scale(d):
    t = base_tensors(fp8=True)
    t["model.layers.1.mlp.experts.0.up_proj.weight_scale_inv"] = tensor("F32", [1, 1], np.float32([np.nan]).tobytes())
    make_model(d, t, qc="fp8")
    return "model.layers.1.mlp.experts.0.up_proj.weight_scale_inv"


def m_fp8_block_scale_shape(d):
    t = base_tensors(fp8=True)
    t["model.layers.1.mlp.experts.0.up_proj.weight_scale_inv"] = tensor("F32", [2, 1], np.float32([1, 1]).tobytes())
    make_model(d, t, qc="fp8")
    return "model.layers.1.mlp.experts.0.up_proj.weight_scale_inv"


def m_fp8_no_scale(d):
    t = base_tensors(fp8=True)
    del t["model.layers.1.mlp.experts.3.gate_proj.weight_scale_inv"]
    make_model(d, t, qc="fp8")
    return "model.layers.1.mlp.experts.3.gate_proj"


def m_quantized_norm(d):
    t = base_tensors()
    t["model.norm.weight"] = tensor("U8", [64])
    make_model(d, t)
    return "model.norm.weight"


def m_bf16_with_scale(d):
    t = base_tensors()
    t["model.layers.0.self_attn.kv_b_proj.weight_scale"] = tensor("U8", [64, 1])
    make_model(d, t)
    return "model.layers.0.self_attn.kv_b_proj"


def m_no_config(d):
    make_model(d)
    (d / "config.json").unlink()
    return "config.json"


def m_config_bad_json(d):
    make_model(d)
    (d / "config.json").write_text('{"architectures": ["GlmMoeDsaForCausalLM"],')
    return "config.json"


def m_unknown_arch(d):
    make_model(d, config={**CONFIG, "architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    return "GlmMoeDsaForCausalLM"  # the error lists the supported ones


def m_no_q_lora(d):
    make_model(d, config={**CONFIG, "q_lora_rank": None})  # absent would take the class default, as in HF
    return "q_lora_rank"


def m_groups(d):
    make_model(d, config={**CONFIG, "n_group": 3, "topk_group": 1})
    return "n_group"


def m_bad_quant_method(d):
    make_model(d, qc=None)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq"}
    (d / "config.json").write_text(json.dumps(cfg))
    return "awq"


def m_no_safetensors(d):
    make_model(d)
    _st(d).unlink()
    return str(d.name)


# Checkpoints that lack tensors their config implies: `latent plan` refuses them as the load does, with one error
# naming the first missing tensor (in load order: embedding, final norm, lm_head, then layer by layer) and the count.
class Missing:
    def __init__(self, first, count, *args, also=""):
        self.first, self.count, self.args, self.also = first, count, args, also


def _without(t, prefix):
    return {k: v for k, v in t.items() if not k.startswith(prefix)}


# Tensors CONFIG implies per MoE layer (companions aside; the router bias is optional): 2 norms, 5 attention
# Linears and 2 norms, the indexer (3 Linears, LayerNorm weight and bias), the router, 3 per routed / shared expert.
MOE_LAYER_TENSORS = 2 + 7 + 5 + 1 + 3 * 4 + 3


def m_missing_layer(d):
    make_model(d, _without(base_tensors(), "model.layers.1."))
    return Missing("model.layers.1.input_layernorm.weight", MOE_LAYER_TENSORS)


def m_missing_expert_weight(d):
    t = base_tensors()
    del t["model.layers.1.mlp.experts.2.down_proj.weight"], t["model.layers.1.mlp.experts.2.down_proj.weight_scale"]
    make_model(d, t)
    return Missing("model.layers.1.mlp.experts.2.down_proj.weight", 1)


def m_missing_fp8_expert_weight(d):
    t = base_tensors(fp8=True)
    del t["model.layers.1.mlp.shared_experts.up_proj.weight"]
    del t["model.layers.1.mlp.shared_experts.up_proj.weight_scale_inv"]
    make_model(d, t, qc="fp8")
    return Missing("model.layers.1.mlp.shared_experts.up_proj.weight", 1)


def m_missing_lm_head_and_norm(d):
    t = base_tensors()
    del t["lm_head.weight"], t["model.layers.0.self_attn.kv_a_layernorm.weight"]
    make_model(d, t)  # tie_word_embeddings is false: lm_head is required
    return Missing("lm_head.weight", 2)


def m_missing_indexer_key(d):
    t = base_tensors()
    del t["model.layers.0.self_attn.indexer.wk.weight"]
    make_model(d, t)
    return Missing("model.layers.0.self_attn.indexer.wk.weight", 1)


def m_wrong_linear_shape(d):
    t = base_tensors()
    t["model.layers.0.self_attn.q_b_proj.weight"] = tensor("BF16", [60, 32])  # a valid file, a wrong shape
    make_model(d, t)
    return "model.layers.0.self_attn.q_b_proj.weight"


def _mtp_layer(t):
    """Layer 2 (the MTP layer of a 2-layer CONFIG): a copy of MoE layer 1 plus its own norms and eh_proj."""
    t = dict(t)
    for k in [k for k in t if k.startswith("model.layers.1.")]:
        t[k.replace("model.layers.1.", "model.layers.2.", 1)] = t[k]
    for n in ("enorm", "hnorm", "shared_head.norm"):
        t[f"model.layers.2.{n}.weight"] = tensor("BF16", [64])
    t["model.layers.2.eh_proj.weight"] = tensor("BF16", [64, 128])
    return t


MTP_CONFIG = {**CONFIG, "num_nextn_predict_layers": 1}


def m_mtp_layer_absent(d):
    make_model(d, config=MTP_CONFIG)  # announced, not there, and speculation asks for it
    return Missing("model.layers.2.input_layernorm.weight", MOE_LAYER_TENSORS + 4, "--num-speculative-tokens", "1",
                   also="MTP layer 2")


def m_mtp_layer_partial(d):
    t = _mtp_layer(base_tensors())
    del t["model.layers.2.mlp.experts.3.up_proj.weight"], t["model.layers.2.mlp.experts.3.up_proj.weight_scale"]
    del t["model.layers.2.eh_proj.weight"]
    make_model(d, t, config=MTP_CONFIG)
    return Missing("model.layers.2.mlp.experts.3.up_proj.weight", 2, "--speculative-config",
                   '{"method": "mtp", "num_speculative_tokens": 2}', also="MTP layer 2")


MALFORMED = [v for k, v in sorted(globals().items()) if k.startswith("m_")]


@pytest.mark.parametrize("maker", MALFORMED, ids=[m.__name__[2:] for m in MALFORMED])
def test_malformed_checkpoint(tmp_path, maker):
    d = tmp_path / "ckpt"
    expect = maker(d)
    args = expect.args if isinstance(expect, Missing) else ()
    for form in ([], ["--json"]):
        p = run("plan", "--model", d, *form, *args)
        assert p.returncode == 1, f"exit {p.returncode}\nstderr: {p.stderr}"
        assert p.stdout == ""
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        assert len(lines) == 1, p.stderr
        assert lines[0].startswith("latent: error: "), lines[0]
        if isinstance(expect, Missing):
            n = expect.count
            assert f"{n} tensor{'' if n == 1 else 's'} that config.json implies {'is' if n == 1 else 'are'} missing" \
                   f" from the checkpoint, the first '{expect.first}'" in lines[0], lines[0]
            assert str(d) in lines[0] and expect.also in lines[0], lines[0]
        else:
            assert expect in lines[0], f"error does not name {expect!r}: {lines[0]}"
        assert "AddressSanitizer" not in p.stderr and "runtime error" not in p.stderr


def test_corpus_size():
    assert len(MALFORMED) >= 20


@pytest.mark.parametrize("maker", [m_missing_expert_weight, m_mtp_layer_absent, m_wrong_linear_shape],
                         ids=lambda m: m.__name__[2:])
def test_load_refuses_what_plan_refuses(tmp_path, maker):
    """One check for both: `latent run` fails at load with the very line `latent plan` prints."""
    d = tmp_path / "ckpt"
    expect = maker(d)
    args = expect.args if isinstance(expect, Missing) else ()
    plan = run("plan", "--model", d, *args)
    load = run("run", "--model", d, "--prompt-tokens", "1 2", "--max-tokens", "1", *args)
    assert plan.returncode == 1 and load.returncode == 1, load.stderr
    assert load.stderr.strip().splitlines()[-1] == plan.stderr.strip(), (load.stderr, plan.stderr)


def test_checkpoint_complete_with_its_mtp_layer(tmp_path):
    d = make_model(tmp_path / "m", _mtp_layer(base_tensors()), config=MTP_CONFIG)
    for spec in ([], ["--num-speculative-tokens", "1"]):
        p = run("plan", "--model", d, "--json", *spec, check=True)
        assert p.stderr == ""
        plan = {o["name"]: o for o in json.loads(p.stdout)}
        assert plan["model.layers.2.eh_proj.weight"]["skipped"] == (not spec)


def test_mtp_layer_announced_but_absent_without_speculation_is_a_warning(tmp_path):
    """The main model loads without its MTP layer: the plan stands and says speculation would be refused."""
    d = make_model(tmp_path / "m", config=MTP_CONFIG)
    msg = (f"config.json announces 1 MTP layer(s) (num_nextn_predict_layers) but {MOE_LAYER_TENSORS + 4} of their "
           "tensors are missing, the first 'model.layers.2.input_layernorm.weight': speculative decoding would be "
           "refused")
    p = run("plan", "--model", d, "--json", check=True)
    assert p.stderr.strip() == "latent: warning: " + msg
    json.loads(p.stdout)
    p = run("plan", "--model", d, check=True)
    assert "warning      " + msg in p.stdout


@pytest.mark.parametrize("form", [[], ["--json"], ["--json", "--expert-parallel-size", "2"],
                                  ["--expert-parallel-size", "2"]], ids=["text", "json", "json-ep2", "text-ep2"])
def test_plan_flags_are_checked_in_every_output_form(tmp_path, form):
    d = make_model(tmp_path / "m")
    for bad, msg in [(["--activations", "bogus"], "--activations must be fp32, bf16 or declared (got 'bogus')"),
                     (["--max-quant-error", "-1"], "--max-quant-error must be"),
                     (["--num-speculative-tokens", "99"], "--num-speculative-tokens must be in [0, 16]")]:
        p = run("plan", "--model", d, *form, *bad)
        assert p.returncode == 1 and p.stdout == "", (form, bad, p.stdout[:200])
        assert p.stderr.strip() == "latent: error: " + msg or p.stderr.startswith("latent: error: " + msg), p.stderr
    p = run("plan", "--model", d, *form, "--activations", "bf16", check=True)
    if "--json" not in form:
        assert "activations: bf16 (--activations bf16)" in p.stdout
    # A layout the checkpoint cannot take (tp 2 cuts the 32-element MXFP4 scale blocks) prints no half plan.
    p = run("plan", "--model", d, *[f for f in form if f == "--json"], "--tensor-parallel-size", "2")
    assert p.returncode == 1 and p.stdout == "" and "MXFP4 scale block" in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------------------------------
# The committed tiny models (tools/make_tiny_models.py).
# ---------------------------------------------------------------------------------------------------------------

def _plan(model, *extra, check=True):
    p = run("plan", "--model", MODELS / model, "--json", *extra, check=check)
    return p, ({o["name"]: o for o in json.loads(p.stdout)} if p.returncode == 0 else None)


@pytest.mark.skipif(not (MODELS / "glm5-tiny-mxfp4").exists(), reason="tiny models not generated")
def test_glm5_mxfp4_plan_keeps_kv_b_proj_bf16():
    """The bug this project exists to prevent: kv_b_proj of a GLM-5 MXFP4 checkpoint is bf16 and must stay so."""
    _, plan = _plan("glm5-tiny-mxfp4")
    experts = [o for n, o in plan.items() if ".mlp.experts." in n and n.endswith("_proj.weight")]
    assert experts and all(o["stored"] == "mxfp4" and o["compute"] == "mxfp4" for o in experts)
    kvb = [o for n, o in plan.items() if n.endswith("kv_b_proj.weight")]
    assert kvb and all(o["stored"] == "bf16" and o["compute"] == "bf16" and o["transform"] == "none"
                       and o["rel_error"] == 0 for o in kvb)
    assert all(o["transform"] == "none" for o in plan.values())


@pytest.mark.skipif(not (MODELS / "glm5-tiny-mxfp4").exists(), reason="tiny models not generated")
def test_quantize_guard_refuses_kv_b_proj_mxfp4():
    p = run("plan", "--model", MODELS / "glm5-tiny-mxfp4", "--quantize", "*.kv_b_proj=mxfp4", "--json")
    assert p.returncode == 1
    assert "kv_b_proj" in p.stderr and "rel_error" in p.stderr and "--allow-lossy" in p.stderr
    p, plan = _plan("glm5-tiny-mxfp4", "--quantize", "*.kv_b_proj=mxfp4", "--allow-lossy")
    kvb = [o for n, o in plan.items() if n.endswith("kv_b_proj.weight")]
    assert kvb and all(o["compute"] == "mxfp4" and o["transform"] != "none" and 0.09 < o["rel_error"] < 0.14
                       and o.get("guard") == "lifted by --allow-lossy" for o in kvb)
    others = [o for n, o in plan.items() if not n.endswith("kv_b_proj.weight")]
    assert all(o["transform"] == "none" for o in others)
    text = run("plan", "--model", MODELS / "glm5-tiny-mxfp4", "--quantize", "*.kv_b_proj=mxfp4", "--allow-lossy",
               check=True).stdout
    assert "guard lifted by --allow-lossy" in text


@pytest.mark.skipif(not (MODELS / "glm5-tiny-mxfp4").exists(), reason="tiny models not generated")
def test_quantize_fp8_within_budget_and_bad_rules():
    _, plan = _plan("glm5-tiny-mxfp4", "--quantize", "*.o_proj=fp8_e4m3_tensor")
    o = [v for n, v in plan.items() if n.endswith("o_proj.weight")]
    assert o and all(0.015 < v["rel_error"] < 0.04 and v["compute"] == "fp8_e4m3_tensor" for v in o)
    p = run("plan", "--model", MODELS / "glm5-tiny-mxfp4", "--quantize", "*.nothing=mxfp4")
    assert p.returncode == 1 and "matches no Linear weight" in p.stderr
    p = run("plan", "--model", MODELS / "glm5-tiny-mxfp4", "--quantize", "*.o_proj=int3")
    assert p.returncode == 1 and "int3" in p.stderr


@pytest.mark.skipif(not (MODELS / "v3-tiny-fp8").exists(), reason="tiny models not generated")
def test_v3_fp8_plan():
    _, plan = _plan("v3-tiny-fp8")
    q = [o for n, o in plan.items() if n.endswith("q_b_proj.weight")]
    assert q and all(o["stored"] == "fp8_e4m3_block128" for o in q)
    assert plan["lm_head.weight"]["stored"] == "bf16"
