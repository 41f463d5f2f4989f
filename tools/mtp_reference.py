#!/usr/bin/env python3
"""fp64 numpy reference of the multi-token-prediction (MTP, "NextN") layer of GLM-5 / DeepSeek-V3 / V3.2
checkpoints, as latent runs it. transformers does not implement MTP (it drops the layer at load), so this file
is the definition the C++ engine (src/model/mtp.cpp) is tested against.

  python3 tools/mtp_reference.py MODEL_DIR --hidden H.npy --tokens "t0 t1 ..." [--draft K] [--out DIR]
  python3 tools/mtp_reference.py fixture MODEL_DIR BASE_GOLDEN_DIR OUT_DIR     (tests/golden/*-mtp)

The MTP layer is stored as `model.layers.{L}.*` (L = num_hidden_layers):
  enorm.weight, hnorm.weight          RMSNorm [D] of the token embedding and of the main model's hidden state
  eh_proj.weight                      Linear [D, 2D] over concat(enorm(embed), hnorm(hidden)) (embedding first)
  <a full decoder layer>              input_layernorm, self_attn.* (MLA, + indexer.* on DSA models: the MTP
                                      layer always has its own indexer), post_attention_layernorm, mlp.* (MoE
                                      when n_routed_experts > 0 and L >= first_k_dense_replace, else dense)
  shared_head.norm.weight             RMSNorm [D] before the head
  shared_head.head.weight             [V, D] (optional: when absent the main lm_head is used)
  embed_tokens.weight                 [V, D] (optional: when absent the main model.embed_tokens is used)

Slots. The layer keeps its own KV cache, one slot per token position q. Slot q holds the pair
(hidden_{q-1}, t_q): the main model's hidden state of position q-1 (the tensor its lm_head reads: the output
of the final RMSNorm) and the embedding of the token at q; slot 0 has no previous hidden state and uses a zero
vector there (hnorm(0) = 0). The output of slot q predicts t_{q+1}. This is vLLM's / SGLang's pairing
(hidden of position i with the embedding of token i+1, predicting token i+2) with the RoPE positions shifted by
one (relative positions, hence attention, are unchanged), so that a slot depends only on the tokens up to its
own position and paged blocks stay shareable (prefix cache, n > 1).

Per slot: x = eh_proj(concat(enorm(E[t_q]), hnorm(hidden_{q-1}))), then the decoder layer (pre-norm residual
blocks, causal attention over the slots <= q, DSA top-k selection over them), then n = shared_head.norm(x),
logits = head(n). Drafting k > 1 tokens applies the layer to its own output: draft 1 = argmax(logits of the
last real slot n); slot n+1 = (that slot's n vector, draft 1) gives draft 2, and so on (SGLang's recursion,
and vLLM's since its fix: the normalized hidden state is what goes on).

Quantized checkpoints (MXFP4, block FP8) are dequantized exactly (tools/quantize_np.py). Written for the tiny
models' fixtures (tools/make_tiny_models.py --mtp): see tests/golden/README.md.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quantize_np  # noqa: E402


# ------------------------------------------------------------------------------------------------ checkpoint
def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    T, _ = quantize_np.load_dir(model_dir)
    W = {k: v.astype(np.float64) for k, v in quantize_np.dequantize_tensors(T, cfg).items()}
    return cfg, W


class Geometry:
    """The config fields the layer needs, with the defaults of the three architectures."""

    def __init__(self, cfg):
        g = lambda k, d=None: cfg.get(k, d) if cfg.get(k) is not None else d  # noqa: E731
        self.mt = cfg["model_type"]
        self.L = cfg["num_hidden_layers"]
        self.D, self.V, self.H = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
        self.dn, self.dr, self.dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        self.dc, self.dq = cfg["kv_lora_rank"], cfg["q_lora_rank"]
        self.eps = g("rms_norm_eps", 1e-6)
        self.E, self.K = g("n_routed_experts", 0), g("num_experts_per_tok", 0)
        self.G, self.TG = g("n_group", 1), g("topk_group", 1)
        self.norm_topk, self.rsf = g("norm_topk_prob", True), g("routed_scaling_factor", 1.0)
        self.first_dense = g("first_k_dense_replace", 0)
        self.nI, self.dI, self.topk = g("index_n_heads", 0), g("index_head_dim", 0), g("index_topk", 0)
        self.rope_interleave = g("rope_interleave", True)
        self.index_interleave = self.mt == "glm_moe_dsa"  # V3.2: half-split pairs; GLM: interleaved
        rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        if "rope_theta" not in rp:
            rp["rope_theta"] = g("rope_theta", 10000.0)
        self.rope = rp
        self.inv_freq, self.attn_factor = self._rope()
        self.scale = (self.dn + self.dr) ** -0.5
        if rp.get("rope_type", rp.get("type", "default")) == "yarn" and rp.get("mscale_all_dim"):
            self.scale *= self._mscale(rp["factor"], rp["mscale_all_dim"]) ** 2

    @staticmethod
    def _mscale(f, m=1.0):
        return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0

    def _rope(self):
        rp, d = self.rope, self.dr
        base = rp["rope_theta"]
        inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
        if rp.get("rope_type", rp.get("type", "default")) != "yarn":
            return inv, 1.0
        f, L0 = rp["factor"], rp["original_max_position_embeddings"]
        dim_of = lambda rot: d * math.log(L0 / (rot * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
        lo = max(math.floor(dim_of(rp.get("beta_fast", 32))), 0)
        hi = min(math.ceil(dim_of(rp.get("beta_slow", 1))), d - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        inv = inv * (1 - ramp) + inv / f * ramp
        if rp.get("attention_factor") is not None:
            return inv, rp["attention_factor"]
        m, ma = rp.get("mscale"), rp.get("mscale_all_dim")
        af = self._mscale(f, m) / self._mscale(f, ma) if (m and ma) else self._mscale(f)
        return inv, af


# ------------------------------------------------------------------------------------------------ ops
def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rotate(x, pos, geo, interleaved):
    """RoPE on the last axis of x [S, (heads,) dr] at positions pos [S]."""
    ang = pos[:, None] * geo.inv_freq[None, :]
    c, s = np.cos(ang) * geo.attn_factor, np.sin(ang) * geo.attn_factor
    while c.ndim < x.ndim:
        c, s = c[:, None, :], s[:, None, :]
    out = np.empty_like(x)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, b * c + a * s
    else:
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        out[..., :h], out[..., h:] = a * c - b * s, b * c + a * s
    return out


def silu(x):
    return x / (1 + np.exp(-x))


def swiglu(x, W, p):
    return (silu(x @ W[p + "gate_proj.weight"].T) * (x @ W[p + "up_proj.weight"].T)) @ W[p + "down_proj.weight"].T


def moe(x, W, p, geo, stats):
    E, K, G = geo.E, geo.K, geo.G
    s = 1 / (1 + np.exp(-(x @ W[p + "gate.weight"].T)))  # [S, E] sigmoid scores
    biased = s + (W[p + "gate.e_score_correction_bias"] if p + "gate.e_score_correction_bias" in W else 0)
    grp = np.sort(biased.reshape(-1, G, E // G), -1)[..., ::-1][..., :2].sum(-1)  # [S, G] top-2 sums
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        gorder = np.argsort(-grp[t], kind="stable")
        keep = np.zeros(E, bool)
        for gi in gorder[: geo.TG]:
            keep[gi * (E // G):(gi + 1) * (E // G)] = True
        if geo.TG < G:
            gs = np.sort(grp[t])[::-1]
            stats["group_margin"] = min(stats.get("group_margin", 1e9), gs[geo.TG - 1] - gs[geo.TG])
        sc = np.where(keep, biased[t], -np.inf)
        order = np.argsort(-sc, kind="stable")
        ids = order[:K]
        ss = np.sort(sc)[::-1]
        if np.isfinite(ss[K]):
            stats["router_margin"] = min(stats.get("router_margin", 1e9), ss[K - 1] - ss[K])
        w = s[t, ids]
        if geo.norm_topk:
            w = w / (w.sum() + 1e-20)
        w = w * geo.rsf
        for e, we in zip(ids, w):
            y[t] += we * swiglu(x[t:t + 1], W, f"{p}experts.{e}.")[0]
    if p + "shared_experts.gate_proj.weight" in W:
        y = y + swiglu(x, W, p + "shared_experts.")
    return y


def indexer_selection(hn, cq, W, p, pos, geo, stats):
    """DSA: per query the index_topk keys of highest score among the causal ones (all of them when fewer)."""
    S, nI, dI, dr = hn.shape[0], geo.nI, geo.dI, geo.dr
    q = (cq @ W[p + "wq_b.weight"].T).reshape(S, nI, dI)
    k = layer_norm(hn @ W[p + "wk.weight"].T, W[p + "k_norm.weight"], W[p + "k_norm.bias"], 1e-6)
    q = np.concatenate([rotate(q[..., :dr], pos, geo, geo.index_interleave), q[..., dr:]], -1)
    k = np.concatenate([rotate(k[:, :dr], pos, geo, geo.index_interleave), k[:, dr:]], -1)
    w = (hn @ W[p + "weights_proj.weight"].T) * nI ** -0.5
    score = np.einsum("sh,sht->st", w, np.maximum(np.einsum("shd,td->sht", q, k) * dI ** -0.5, 0))
    allowed = np.zeros((S, S), bool)
    for s in range(S):
        vis = score[s, : s + 1]
        if s + 1 <= geo.topk:
            allowed[s, : s + 1] = True
            continue
        order = np.argsort(-vis, kind="stable")
        allowed[s, order[: geo.topk]] = True
        v = np.sort(vis)[::-1]
        stats["index_rel_gap"] = min(stats.get("index_rel_gap", 1e9), (v[geo.topk - 1] - v[geo.topk]) / np.abs(v).max())
    return allowed


def decoder_layer(h, W, p, geo, pos, stats):
    """One pre-norm decoder layer over the S slots h [S, D] (causal), returning the new residual stream."""
    S, H, dn, dr, dv, dc = h.shape[0], geo.H, geo.dn, geo.dr, geo.dv, geo.dc
    a = p + "self_attn."
    x = rms(h, W[p + "input_layernorm.weight"], geo.eps)
    cq = rms(x @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"], 1e-6)
    q = (cq @ W[a + "q_b_proj.weight"].T).reshape(S, H, dn + dr)
    kv = x @ W[a + "kv_a_proj_with_mqa.weight"].T
    c = rms(kv[:, :dc], W[a + "kv_a_layernorm.weight"], 1e-6)
    k_pe = rotate(kv[:, dc:], pos, geo, geo.rope_interleave)
    q_pe = rotate(q[..., dn:], pos, geo, geo.rope_interleave)
    allowed = np.tril(np.ones((S, S), bool))
    if geo.nI > 0:
        allowed = indexer_selection(x, cq, W, a + "indexer.", pos, geo, stats) & allowed
    kvx = (c @ W[a + "kv_b_proj.weight"].T).reshape(S, H, dn + dv)
    score = (np.einsum("shd,thd->hst", q[..., :dn], kvx[..., :dn]) + np.einsum("shr,tr->hst", q_pe, k_pe)) * geo.scale
    score = np.where(allowed[None], score, -np.inf)
    score = np.exp(score - score.max(-1, keepdims=True))
    score /= score.sum(-1, keepdims=True)
    o = np.einsum("hst,thv->shv", score, kvx[..., dn:]).reshape(S, H * dv)
    h = h + o @ W[a + "o_proj.weight"].T
    x = rms(h, W[p + "post_attention_layernorm.weight"], geo.eps)
    is_moe = geo.E > 0 and geo.L >= geo.first_dense
    return h + (moe(x, W, p + "mlp.", geo, stats) if is_moe else swiglu(x, W, p + "mlp."))


def mtp_tensor(W, geo, name, fallback):
    p = f"model.layers.{geo.L}."
    return W[p + name] if p + name in W else W[fallback]


def mtp_slots(W, geo, tokens, hidden, stats=None):
    """Slots 0 .. n of the MTP layer for tokens t_0..t_n and the main model's hidden rows h_0..h_{n-1}
    ([n, D]; row q-1 pairs with token q; slot 0 pairs with a zero vector). Returns (logits [n+1, V],
    normed [n+1, D]: the shared_head.norm output, the hidden state a recursive draft continues from)."""
    stats = {} if stats is None else stats
    p = f"model.layers.{geo.L}."
    tokens = np.asarray(tokens, dtype=np.int64)
    n1 = len(tokens)
    prev = np.zeros((n1, geo.D))
    prev[1:] = hidden[: n1 - 1]
    emb = mtp_tensor(W, geo, "embed_tokens.weight", "model.embed_tokens.weight")[tokens]
    x = np.concatenate([rms(emb, W[p + "enorm.weight"], geo.eps), rms(prev, W[p + "hnorm.weight"], geo.eps)], -1)
    h = x @ W[p + "eh_proj.weight"].T
    h = decoder_layer(h, W, p, geo, np.arange(n1, dtype=np.float64), stats)
    normed = rms(h, W[p + "shared_head.norm.weight"], geo.eps)
    return normed @ mtp_tensor(W, geo, "shared_head.head.weight", "lm_head.weight").T, normed


def draft(W, geo, tokens, hidden, k, stats=None):
    """k greedy draft tokens after t_0..t_n (hidden rows h_0..h_{n-1}): slot n gives draft 1, slot n+j (the
    pair (normed output of slot n+j-1, draft j)) gives draft j+1. Returns (drafts [k], logits [k, V])."""
    toks, hid = list(tokens), np.asarray(hidden, dtype=np.float64)
    drafts, rows = [], []
    for _ in range(k):
        logits, normed = mtp_slots(W, geo, toks, hid, stats)
        d = int(np.argmax(logits[-1]))
        srt = np.sort(logits[-1])[::-1]
        if stats is not None:
            stats["draft_margin"] = min(stats.get("draft_margin", 1e9), float(srt[0] - srt[1]))
        drafts.append(d)
        rows.append(logits[-1])
        hid = np.concatenate([hid[: len(toks)], normed[-1:]], 0)  # the pair of the new slot: (normed, draft)
        toks.append(d)
    return drafts, np.stack(rows)


def fixture(model_dir, golden, out, k=3):
    """tests/golden/<mtp model>/: the prompt of the base model's fixture (golden/tokens.json, T tokens) plus the
    main model's greedy next token t_T (argmax of golden/logits.npy row T-1), the MTP logits of slots 0..T from
    the base fixture's hidden states (hidden.npy, last entry: the final RMSNorm's output, rows 0..T-1),
    and k greedy drafts after slot T."""
    import hashlib
    cfg, W = load(model_dir)
    geo = Geometry(cfg)
    with open(os.path.join(golden, "tokens.json")) as f:
        prompt = json.load(f)["tokens"]
    main_logits = np.load(os.path.join(golden, "logits.npy")).astype(np.float64)
    hid = np.load(os.path.join(golden, "hidden.npy")).astype(np.float64)[-1]
    last = np.sort(main_logits[-1])[::-1]
    toks = list(prompt) + [int(np.argmax(main_logits[-1]))]
    stats = {}
    logits, _ = mtp_slots(W, geo, toks, hid, stats)
    mstats = dict(stats)
    drafts, rows = draft(W, geo, toks, hid, k, stats)
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "mtp_logits.npy"), logits.astype("<f4"))
    np.save(os.path.join(out, "mtp_draft_logits.npy"), rows.astype("<f4"))
    with open(os.path.join(out, "mtp_draft.json"), "w") as f:
        json.dump({"tokens": toks, "drafts": drafts}, f)
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    meta = {"model": os.path.basename(os.path.normpath(model_dir)), "model_sha256": sha,
            "hidden_from": os.path.join(os.path.basename(os.path.normpath(golden)), "hidden.npy") + " (last entry)",
            "main_next_token_margin": float(last[0] - last[1]), "max_abs_mtp_logit": float(np.abs(logits).max()),
            "slots": len(toks), "drafts": drafts,
            "margins": {kk: float(v) for kk, v in stats.items()},
            "margins_slots_only": {kk: float(v) for kk, v in mstats.items()},
            "numpy": np.__version__, "python": sys.version.split()[0]}
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    return meta


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "fixture":
        ap = argparse.ArgumentParser(prog="mtp_reference.py fixture")
        ap.add_argument("model_dir")
        ap.add_argument("golden", help="the base model's tests/golden folder (tokens, logits, hidden)")
        ap.add_argument("out")
        a = ap.parse_args(sys.argv[2:])
        print(json.dumps(fixture(a.model_dir, a.golden, a.out), indent=1))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--hidden", required=True, help=".npy [L+1, T, D] (hidden.npy of tests/golden) or [T, D]")
    ap.add_argument("--tokens", required=True, help="t_0 .. t_n (n <= rows of --hidden)")
    ap.add_argument("--draft", type=int, default=3)
    ap.add_argument("--out", help="write mtp_logits.npy / mtp_draft.json here")
    a = ap.parse_args()
    cfg, W = load(a.model_dir)
    geo = Geometry(cfg)
    hid = np.load(a.hidden).astype(np.float64)
    if hid.ndim == 3:
        hid = hid[-1]
    toks = [int(t) for t in a.tokens.split()]
    stats = {}
    logits, _ = mtp_slots(W, geo, toks, hid, stats)
    drafts, rows = draft(W, geo, toks, hid, a.draft, stats)
    print("drafts", drafts, "stats", {k: float(v) for k, v in stats.items()})
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        np.save(os.path.join(a.out, "mtp_logits.npy"), logits.astype("<f4"))
        with open(os.path.join(a.out, "mtp_draft.json"), "w") as f:
            json.dump({"tokens": toks, "drafts": drafts}, f)


if __name__ == "__main__":
    main()
