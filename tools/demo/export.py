#!/usr/bin/env python3
"""Exports a trained latent-demo checkpoint as a Hugging Face directory in GLM-5's MXFP4 precision layout.

Routed experts -> Quark-style MXFP4 (`.weight` U8 [out, in/2], `.weight_scale` U8 [out, in/32], e8m0),
router bias fp32, everything else bf16. Also writes config.json (quantization_config quant_method quark),
generation_config.json, and copies tokenizer.json / tokenizer_config.json / chat_template.jinja.

usage: export.py CKPT_DIR_OR_PT TOKENIZER_DIR OUT_DIR
"""
import json
import os
import re
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import mxfp4  # noqa: E402

QUANT_CONFIG = {
    "quant_method": "quark",
    "quant_mode": "eager_mode",
    "version": "0.11",
    "exclude": ["lm_head", "re:.*mlp.gate$", "re:.*self_attn.*", "re:.*mlp.shared_experts.*",
                "re:model.layers.0.mlp.*"],
    "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
               "weight_format": "real_quantized", "weight_merge_groups": None},
    "global_quant_config": {
        "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
                   "scale_format": "e8m0", "scale_type": "float", "scale_calculation_mode": "floor",
                   "round_method": "half_even", "is_dynamic": False, "observer_cls": "PerBlockMXObserver",
                   "mx_element_dtype": None, "symmetric": None, "is_scale_quant": False},
        "input_tensors": None, "output_tensors": None, "bias": None, "target_device": None},
    "layer_quant_config": {}, "layer_type_quant_config": {}, "kv_cache_quant_config": {},
    "kv_cache_post_rope": False, "algo_config": None, "softmax_quant_spec": None,
}

EXPERTS_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def load_ckpt(path):
    """CKPT: a .pt from train.py, or a directory with meta.json + state-*.safetensors."""
    if os.path.isdir(path):
        meta = json.load(open(os.path.join(path, "meta.json")))
        sd = {}
        for f in sorted(os.listdir(path)):
            if f.startswith("state-") and f.endswith(".safetensors"):
                sd.update(load_file(os.path.join(path, f)))
        meta["state_dict"] = sd
        return meta
    return torch.load(path, map_location="cpu", weights_only=False)


def checkpoint_tensors(sd, quantize=True):
    """Model state dict (HF fused experts) -> checkpoint tensors (per-expert names)."""
    out = {}
    for k, v in sd.items():
        m = EXPERTS_RE.match(k)
        if m:
            li, kind = m.group(1), m.group(2)
            for e in range(v.shape[0]):
                base = f"model.layers.{li}.mlp.experts.{e}."
                if kind == "gate_up_proj":
                    half = v.shape[1] // 2
                    parts = {"gate_proj": v[e, :half], "up_proj": v[e, half:]}
                else:
                    parts = {"down_proj": v[e]}
                for name, w in parts.items():
                    if quantize:
                        q, s = mxfp4.quantize(w.float())
                        out[base + name + ".weight"] = q
                        out[base + name + ".weight_scale"] = s
                    else:
                        out[base + name + ".weight"] = w.to(torch.bfloat16).contiguous()
        elif k.endswith("e_score_correction_bias"):
            out[k] = v.float().contiguous()
        else:
            out[k] = v.to(torch.bfloat16).contiguous()
    return out


def write_config(cfg_dict, out_dir, quantized):
    from transformers import GlmMoeDsaConfig
    cfg = GlmMoeDsaConfig(**{k: v for k, v in cfg_dict.items() if k not in ("quantization_config",)})
    cfg.architectures = ["GlmMoeDsaForCausalLM"]
    cfg.save_pretrained(out_dir)
    p = os.path.join(out_dir, "config.json")
    d = json.load(open(p))
    d["dtype"] = "bfloat16"
    d.pop("quantization_config", None)
    if quantized:
        d["quantization_config"] = QUANT_CONFIG
    with open(p, "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")
    gen = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)


def export(ckpt, tok_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    sd = ckpt["state_dict"]
    tensors = checkpoint_tensors(sd, quantize=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_config(ckpt["config"], out_dir, quantized=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.abspath(os.path.join(tok_dir, f)) != os.path.abspath(os.path.join(out_dir, f)):
            shutil.copy(os.path.join(tok_dir, f), os.path.join(out_dir, f))
    shutil.copy(os.path.join(common.HERE, "chat_template.jinja"), os.path.join(out_dir, "chat_template.jinja"))
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    eos = [tok.token_to_id(s) for s in common.STOP_TOKENS]
    gen = {"_from_model_config": False, "eos_token_id": eos, "pad_token_id": eos[0], "do_sample": False,
           "max_new_tokens": 256}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    return tensors


def dequantized_dir(model_dir, tmp_dir):
    """Writes a copy of MODEL_DIR with the MXFP4 experts dequantized to bf16 (exact: e2m1 x 2^k fits bf16)
    and no quantization_config, loadable by plain transformers."""
    os.makedirs(tmp_dir, exist_ok=True)
    t = load_file(os.path.join(model_dir, "model.safetensors"))
    out = {}
    for k, v in t.items():
        if k.endswith(".weight_scale"):
            continue
        s = k[:-len("weight")] + "weight_scale"
        if v.dtype == torch.uint8 and s in t:
            d = mxfp4.dequantize(v, t[s])
            b = d.to(torch.bfloat16)
            assert torch.equal(b.float(), d), k
            out[k] = b
        else:
            out[k] = v
    save_file(out, os.path.join(tmp_dir, "model.safetensors"), metadata={"format": "pt"})
    for f in os.listdir(model_dir):
        if f.endswith(".json") or f.endswith(".jinja"):
            shutil.copy(os.path.join(model_dir, f), os.path.join(tmp_dir, f))
    p = os.path.join(tmp_dir, "config.json")
    d = json.load(open(p))
    d.pop("quantization_config", None)
    json.dump(d, open(p, "w"), indent=2)
    return tmp_dir


if __name__ == "__main__":
    ck = load_ckpt(sys.argv[1])
    export(ck, sys.argv[2], sys.argv[3])
    print("exported", sys.argv[3])
