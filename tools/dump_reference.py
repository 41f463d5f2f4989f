#!/usr/bin/env python3
"""Dump Hugging Face reference outputs for the tiny test models (needs torch + transformers 5.17).

  python3 tools/dump_reference.py [--models tests/models] [--out tests/golden] [--only NAME ...]

For each model directory writes <out>/<model>/:
  tokens.json        {"tokens": prompt ids, "seed": numpy default_rng seed}
  logits.npy         float32 [T, V]   HF fp32 prefill (eager attention, eager experts)
  hidden.npy         float32 [L+1, T, D]  output_hidden_states (see meta "hidden_states")
  decode_logits.npy  float32 [T-16, V] prefill 16 tokens, then cached decode of tokens 16..T-1 one at a time
  greedy.json        HF generate, greedy, 12 new tokens from the first 8 prompt tokens (EOS disabled)
  logits_bf16.npy    float32 [T, V]   HF bf16 eager prefill (information only)
  meta.json          versions, checks, indexer gap / router margin figures
  tokens_short.json + logits_short.npy   (DSA models glm5-tiny, v32-tiny) 8-token prompt <= index_topk
Quantized checkpoints: the reference is the fp32 model of the same config without quantization_config,
loaded from the weights dequantized by tools/quantize_np.py (fp32; the bf16 run rounds them RNE to bf16).
The fp32 runs use the CPU (reproducible without a GPU); the bf16 run uses CUDA when available.
"""
import argparse
import copy
import hashlib
import json
import os
import platform
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quantize_np  # noqa: E402

PROMPT_SEED = {"default": 1234}
PROMPT_LEN = {"default": 24, "glm5-tiny-b": 30}
SHORT_SEED = 4321
SHORT_MODELS = ("glm5-tiny", "v32-tiny")
PREFILL = 16
GREEDY_PROMPT, GREEDY_NEW = 8, 12


def classes(model_type):
    import transformers as T
    return {"glm_moe_dsa": (T.GlmMoeDsaConfig, T.GlmMoeDsaForCausalLM),
            "deepseek_v32": (T.DeepseekV32Config, T.DeepseekV32ForCausalLM),
            "deepseek_v3": (T.DeepseekV3Config, T.DeepseekV3ForCausalLM)}[model_type]


def load(path, dtype, device="cpu"):
    with open(os.path.join(path, "config.json")) as f:
        mt = json.load(f)["model_type"]
    _, M = classes(mt)
    m = M.from_pretrained(path, dtype=dtype, attn_implementation="eager", experts_implementation="eager")
    return m.to(device).eval()


# ------------------------------------------------------------------------------------------ capture
class Capture:
    """Records the indexer score matrices (the tensor HF calls .topk on inside the indexer) and the
    router's biased scores, during one forward."""

    def __init__(self, model):
        self.model, self.index_scores, self.router, self.handles = model, [], [], []
        orig_topk = torch.Tensor.topk
        cap = self

        def pre(mod, args, kwargs):
            def rec(t, *a, **k):
                cap.index_scores.append((mod.layer_idx, t.detach().float().cpu().clone()))
                return orig_topk(t, *a, **k)
            torch.Tensor.topk = rec

        def post(mod, args, kwargs, out):
            torch.Tensor.topk = orig_topk

        for i, layer in enumerate(model.model.layers):
            idx = getattr(layer.self_attn, "indexer", None)
            if idx is not None:
                self.handles.append(idx.register_forward_pre_hook(pre, with_kwargs=True))
                self.handles.append(idx.register_forward_hook(post, with_kwargs=True))
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "e_score_correction_bias"):
                self.handles.append(gate.register_forward_hook(
                    lambda mod, inp, out, i=i: cap.router.append((i, self.router_scores(mod, inp[0])))))

    @staticmethod
    def router_scores(g, x):
        x = x.reshape(-1, g.weight.shape[1])
        s = torch.nn.functional.linear(x.float(), g.weight.float()).sigmoid()
        b = s + g.e_score_correction_bias.float()
        E, G = b.shape[-1], g.num_group
        gs = b.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
        return b.detach().cpu().double(), gs.detach().cpu().double()

    def close(self):
        for h in self.handles:
            h.remove()


def indexer_gap(scores_list, topk, past=0):
    """min over layers/rows of the gap between the k-th and (k+1)-th visible score (prefill, causal)."""
    best = {"min_gap": float("inf"), "min_rel_gap": float("inf"), "where": None, "sparse_rows": 0, "zero_scores": 0}
    for layer, sc in scores_list:
        S, T = sc.shape[-2], sc.shape[-1]
        for s in range(S):
            vis = sc[0, s, : past + s + 1].double()
            best["zero_scores"] += int((vis == 0).sum())
            if vis.numel() <= topk:
                continue
            best["sparse_rows"] += 1
            v = vis.sort(descending=True).values
            gap = float(v[topk - 1] - v[topk])
            rel = gap / max(float(vis.abs().max()), 1e-30)
            if rel < best["min_rel_gap"]:
                best.update(min_rel_gap=rel, where=[layer, s])
            best["min_gap"] = min(best["min_gap"], gap)
    return best


def router_margin(router_list, K, topk_group):
    best = {"min_margin": float("inf"), "min_group_margin": float("inf"), "where": None}
    for layer, (b, gs) in router_list:
        N, E = b.shape
        G = gs.shape[-1]
        gsort = gs.sort(-1, descending=True)
        if topk_group < G:
            gm = float((gsort.values[:, topk_group - 1] - gsort.values[:, topk_group]).min())
            best["min_group_margin"] = min(best["min_group_margin"], gm)
        keep = torch.zeros(N, G, dtype=torch.bool)
        keep.scatter_(1, gsort.indices[:, :topk_group], True)
        bm = b.masked_fill(~keep.repeat_interleave(E // G, 1), float("-inf"))
        v = bm.sort(-1, descending=True).values
        for t in range(N):
            if torch.isfinite(v[t, K]):
                m = float(v[t, K - 1] - v[t, K])
                if m < best["min_margin"]:
                    best.update(min_margin=m, where=[layer, t])
    return best


# ------------------------------------------------------------------------------------------ per model
def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def np_save(path, a):
    np.save(path, np.ascontiguousarray(np.asarray(a, dtype="<f4")))


def dump_model(name, mdir, out_root, bf16_device):
    with open(os.path.join(mdir, "config.json")) as f:
        cfg = json.load(f)
    quantized = "quantization_config" in cfg
    tmp = None
    src = mdir
    if quantized:
        tmp = tempfile.mkdtemp(prefix=f"deq-{name}-")
        quantize_np.dequantize_dir(mdir, tmp, "F32")
        src = tmp
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    V, D, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    T = PROMPT_LEN.get(name, PROMPT_LEN["default"])
    seed = PROMPT_SEED.get(name, PROMPT_SEED["default"])
    ids_np = np.random.default_rng(seed).integers(0, V, T)
    ids = torch.tensor(ids_np, dtype=torch.long)[None]
    meta = {"model": name, "model_sha256": sha256(os.path.join(mdir, "model.safetensors")),
            "quantized_reference": ("fp32 model loaded from quantize_np-dequantized weights "
                                    "(W = decode(code) * scale in fp32); no activation quantization")
            if quantized else None,
            "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                         "numpy": np.__version__, "python": platform.python_version()},
            "fp32": {"device": "cpu", "attn_implementation": "eager", "experts_implementation": "eager"},
            "prompt_len": T, "prompt_seed": seed, "decode_prefill": PREFILL}
    json.dump({"tokens": ids_np.tolist(), "seed": seed}, open(os.path.join(out, "tokens.json"), "w"))

    m = load(src, torch.float32)
    # ---- prefill fp32 with captures
    cap = Capture(m)
    normcap = {}
    hn = m.model.norm.register_forward_hook(lambda mod, i, o: normcap.update(inp=i[0].detach(), out=o.detach()))
    with torch.no_grad():
        o = m(ids, output_hidden_states=True, use_cache=False)
    hn.remove()
    cap.close()
    logits = o.logits[0].float()
    hs = torch.stack([h[0] for h in o.hidden_states]).float()
    assert hs.shape == (L + 1, T, D), hs.shape
    last_is = ("post_norm" if torch.equal(o.hidden_states[-1], normcap["out"]) else
               "pre_norm" if torch.equal(o.hidden_states[-1], normcap["inp"]) else "unknown")
    meta["hidden_states"] = (f"hidden.npy[0] = embeddings, hidden.npy[i] = output of decoder layer i-1; "
                             f"last entry is {last_is} (final RMSNorm)")
    meta["hidden_last"] = last_is
    np_save(os.path.join(out, "logits.npy"), logits.numpy())
    np_save(os.path.join(out, "hidden.npy"), hs.numpy())
    meta["max_abs_logit"] = float(logits.abs().max())
    meta["max_abs_hidden"] = float(hs.abs().max())
    if "index_topk" in cfg:
        g = indexer_gap(cap.index_scores, cfg["index_topk"])
        meta["indexer"] = dict(g, index_topk=cfg["index_topk"], n_calls=len(cap.index_scores))
        print(f"  [{name}] indexer: min gap {g['min_gap']:.3e} min rel gap {g['min_rel_gap']:.3e} at {g['where']} "
              f"sparse rows {g['sparse_rows']} exact-zero scores {g['zero_scores']}")
    rm = router_margin(cap.router, cfg["num_experts_per_tok"], cfg["topk_group"])
    meta["router"] = rm
    print(f"  [{name}] router: min expert margin {rm['min_margin']:.3e} at {rm['where']}, "
          f"min group margin {rm['min_group_margin']:.3e}")

    # ---- cached decode fp32
    with torch.no_grad():
        o1 = m(ids[:, :PREFILL], use_cache=True)
        pkv = o1.past_key_values
        pre_d = float((o1.logits[0].float() - logits[:PREFILL]).abs().max())
        steps = []
        for t in range(PREFILL, T):
            o2 = m(ids[:, t:t + 1], past_key_values=pkv, use_cache=True)
            pkv = o2.past_key_values
            steps.append(o2.logits[0, -1].float())
    dec = torch.stack(steps)
    dd = float((dec - logits[PREFILL:]).abs().max())
    np_save(os.path.join(out, "decode_logits.npy"), dec.numpy())
    meta["decode_vs_prefill_max_abs_diff"] = dd
    meta["prefill16_vs_prefill_max_abs_diff"] = pre_d
    print(f"  [{name}] HF fp32 cached decode (rows {PREFILL}..{T-1}) vs prefill: max|d| {dd:.3e}; "
          f"16-token prefill vs rows 0..15: {pre_d:.3e}")
    if dd >= 1e-4:
        print(f"  [{name}] WARNING: cached decode differs from prefill (index/router ties?)")

    # ---- greedy generate fp32
    # None values of a passed GenerationConfig are refilled from model.generation_config (eos 1), so
    # disable EOS on the model's own generation config too
    m.generation_config.eos_token_id = None
    gc = copy.deepcopy(m.generation_config)
    gc.do_sample, gc.max_new_tokens, gc.min_new_tokens = False, GREEDY_NEW, None
    gc.eos_token_id, gc.pad_token_id = None, 0
    gc.temperature = gc.top_p = gc.top_k = None
    with torch.no_grad():
        gen = m.generate(ids[:, :GREEDY_PROMPT], generation_config=gc)[0]
    assert gen.shape[0] == GREEDY_PROMPT + GREEDY_NEW, gen.shape
    with torch.no_grad():
        tf = m(gen[None, :-1], use_cache=False).logits[0].float()
    rows = tf[GREEDY_PROMPT - 1:]
    top2 = rows.topk(2, -1)
    tf_agree = bool(torch.equal(top2.indices[:, 0], gen[GREEDY_PROMPT:]))
    gmargin = float((top2.values[:, 0] - top2.values[:, 1]).min())
    json.dump({"prompt": gen[:GREEDY_PROMPT].tolist(), "generated": gen[GREEDY_PROMPT:].tolist(),
               "max_new_tokens": GREEDY_NEW, "do_sample": False, "eos_disabled": True,
               "min_top1_top2_margin": gmargin, "teacher_forced_argmax_agrees": tf_agree},
              open(os.path.join(out, "greedy.json"), "w"), indent=1)
    meta["greedy"] = {"min_top1_top2_margin": gmargin, "teacher_forced_argmax_agrees": tf_agree}
    print(f"  [{name}] greedy: {gen[GREEDY_PROMPT:].tolist()} teacher-forced agree {tf_agree} min margin {gmargin:.3e}")
    if not tf_agree:
        print(f"  [{name}] WARNING: greedy tokens differ from teacher-forced argmax")

    # ---- short prompt (dense DSA regime) + dense-equivalence check
    if name in SHORT_MODELS:
        sids_np = np.random.default_rng(SHORT_SEED).integers(0, V, 8)
        assert 8 <= cfg["index_topk"]
        sids = torch.tensor(sids_np, dtype=torch.long)[None]
        with torch.no_grad():
            ls = m(sids, use_cache=False).logits[0].float()
        json.dump({"tokens": sids_np.tolist(), "seed": SHORT_SEED}, open(os.path.join(out, "tokens_short.json"), "w"))
        np_save(os.path.join(out, "logits_short.npy"), ls.numpy())
        C3, M3 = classes("deepseek_v3")
        kw = {k: v for k, v in cfg.items() if not k.startswith("index") and k not in
              ("architectures", "model_type", "layer_types", "mlp_layer_types", "transformers_version", "dtype",
               "head_dim", "qk_head_dim")}
        m3 = M3(C3(**kw)).eval()
        missing, unexpected = m3.load_state_dict(m.state_dict(), strict=False)
        assert not missing and all(".indexer." in u for u in unexpected), (missing, unexpected)
        with torch.no_grad():
            l3 = m3(sids, use_cache=False).logits[0].float()
        dsd = float((l3 - ls).abs().max())
        meta["short"] = {"seed": SHORT_SEED, "dense_deepseek_v3_same_weights_max_abs_diff": dsd}
        print(f"  [{name}] short 8-token prompt: DSA model vs dense deepseek_v3 with the same weights max|d| {dsd:.3e}")
        assert dsd < 1e-5
        del m3
    del m

    # ---- bf16 reference (information)
    mb = load(src, torch.bfloat16, bf16_device)
    capb = Capture(mb)
    with torch.no_grad():
        lb = mb(ids.to(bf16_device), use_cache=False).logits[0].float().cpu()
    capb.close()
    np_save(os.path.join(out, "logits_bf16.npy"), lb.numpy())
    bd = {"device": bf16_device, "max_abs_diff_vs_fp32": float((lb - logits).abs().max()),
          "argmax_agree": float((lb.argmax(-1) == logits.argmax(-1)).float().mean()),
          "router_min_margin": router_margin(capb.router, cfg["num_experts_per_tok"], cfg["topk_group"])["min_margin"]}
    if "index_topk" in cfg:
        bd["indexer_min_rel_gap"] = indexer_gap(capb.index_scores, cfg["index_topk"])["min_rel_gap"]
    meta["bf16"] = bd
    print(f"  [{name}] bf16 ({bf16_device}) vs fp32: max|d| {bd['max_abs_diff_vs_fp32']:.3e} "
          f"argmax agree {bd['argmax_agree']:.3f}")
    del mb
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    return meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tests/models")
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--min-rel-gap", type=float, default=1e-4)
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)
    bf16_device = "cuda" if torch.cuda.is_available() else "cpu"
    names = a.only or sorted(d for d in os.listdir(a.models) if os.path.isfile(os.path.join(a.models, d, "config.json")))
    bad = []
    for n in names:
        print(f"== {n}")
        meta = dump_model(n, os.path.join(a.models, n), a.out, bf16_device)
        if meta.get("indexer", {}).get("min_rel_gap", 1.0) <= a.min_rel_gap:
            bad.append((n, "indexer gap", meta["indexer"]["min_rel_gap"]))
        if meta["router"]["min_margin"] <= a.min_rel_gap:
            bad.append((n, "router margin", meta["router"]["min_margin"]))
        if meta["decode_vs_prefill_max_abs_diff"] >= 1e-4 or not meta["greedy"]["teacher_forced_argmax_agrees"]:
            bad.append((n, "decode/greedy", meta["decode_vs_prefill_max_abs_diff"]))
        if meta["router"]["min_group_margin"] <= a.min_rel_gap:
            bad.append((n, "group margin", meta["router"]["min_group_margin"]))
    if bad:
        print("UNHEALTHY (change a seed):", bad)
        sys.exit(1)
    print("all models healthy")


if __name__ == "__main__":
    main()
