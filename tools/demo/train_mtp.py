#!/usr/bin/env python3
"""Trains a multi-token-prediction (MTP) layer for the bundled latent-demo model, the main model frozen, and
writes it into the model directory as GLM-5 stores its MTP layer.

The layer is model.layers.{L}.* (L = num_hidden_layers = 4), with the math of tools/mtp_reference.py and
src/model/mtp.cpp (vLLM's deepseek_mtp.py): slot q pairs the main model's head-input hidden state of position
q-1 (the output of its final RMSNorm; a zero vector for slot 0) with the token at q,
  x = eh_proj(concat(enorm(embed(t_q)), hnorm(h_{q-1})))       (eh_proj [D, 2D], the embedding half first)
  x = decoder block (MLA + its own DSA indexer + MoE, like the main MoE layers; RoPE position q)
  logits = shared_head.head(shared_head.norm(x))                 -> t_{q+1}
i.e. from h_i and embed(t_{i+1}) the layer predicts t_{i+2}. The main embedding is used (no embed_tokens copy);
shared_head.head is a frozen copy of the main lm_head (stored, as GLM-5 stores it).

Training: the main model (loaded like train.py --init: MXFP4 experts dequantized exactly) runs frozen, under
no_grad, to give the hidden states; only the MTP layer learns, by cross-entropy on the trained (assistant)
tokens of the demo corpus (tools/demo/make_corpus.py). The block starts as a copy of main layer L-1 (attention,
indexer, MoE), eh_proj as 0.5 [I | I] + noise, shared_head.norm as the final norm. Phases over --seconds of
wall-clock training (as train.py): dense [0, --dense-frac) with DSA selecting every key, then index_topk = 16, then
QAT [--qat-frac, 1) with the layer's routed experts fake-quantized to MXFP4 (straight-through estimator). The
indexer learns only through the KL loss of train.py (toward the main attention distribution of the same layer,
inputs detached); routing uses the auxiliary-loss-free bias update of train.py.

Evaluation (end of training, and --eval-only): the main model's greedy continuations of held-out eval prompts
(eval.json: capitals, tools, general, arithmetic, units, JSON), then per draft position j = 1..--eval-k the
fraction of continuation positions where drafts 1..j (the recursion of mtp_reference.draft: draft j+1 from the
layer applied to its own normed output, all positions at once through a tree mask) equal the next j tokens of
the continuation: the acceptance greedy speculative decoding sees (latent fidelity reports the same).

Export: the MTP tensors (routed experts MXFP4 in the main experts' encoding, the router bias F32, everything
else BF16) are added to OUT_DIR/model.safetensors beside the main model's tensors, which are copied byte for byte
(checked); config.json gets num_nextn_predict_layers 1 and quantization_config excludes eh_proj and shared_head.

usage: train_mtp.py CORPUS_DIR MODEL_DIR OUT_DIR [--seconds 220] [--device cuda|cpu] [--tiny] [--report F.json]
                    [--card F.md]
  MODEL_DIR: the exported demo model (an MTP layer already in it is the warm start unless --fresh)
  OUT_DIR: where the model with its MTP layer is written (may be MODEL_DIR: only model.safetensors and config.json
  change; the other files are copied when it differs)
  --tiny: CPU smoke run (a few records, a few steps, a small evaluation)
"""
import argparse
import copy
import json
import os
import random
import shutil
import sys
import tempfile
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import common  # noqa: E402
import export  # noqa: E402
import mxfp4  # noqa: E402
import quantize_np  # noqa: E402  (tools/quantize_np.py: raw safetensors I/O)
import train  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import GlmMoeDsaForCausalLM  # noqa: E402
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import (  # noqa: E402
    GlmMoeDsaDecoderLayer, GlmMoeDsaRMSNorm)

INDEX_TOPK = train.INDEX_TOPK
TREE_BUDGET = 100_000_000  # B * (k S)^2 of one acceptance batch (the indexer scores: 16 x that many floats)
EXTRA_EXCLUDE = ["re:.*eh_proj$", "re:.*shared_head.*"]  # bf16 Linear weights of the MTP layer


# ---- experts: every expert on every token, weighted by the routing matrix (train.py's dense form, no host syncs);
# the MTP layer's experts fake-quantized to MXFP4 when their module has qat = True.
def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    w1, w2 = self.gate_up_proj, self.down_proj
    if getattr(self, "qat", False):
        w1, w2 = mxfp4.fake_quant_ste(w1), mxfp4.fake_quant_ste(w2)
    h = torch.einsum("nd,efd->enf", hidden_states, w1)
    gate, up = h.chunk(2, dim=-1)
    y = torch.einsum("eni,edi->end", self.act_fn(gate) * up, w2)
    r = torch.zeros(hidden_states.shape[0], self.num_experts, device=h.device, dtype=top_k_weights.dtype)
    r = r.scatter(1, top_k_index, top_k_weights)
    with torch.no_grad():
        self.last_load = torch.bincount(top_k_index.flatten(), minlength=self.num_experts)
    return torch.einsum("end,ne->nd", y, r.to(y.dtype))


def experts_forward_sparse(self, hidden_states, top_k_index, top_k_weights):
    """The same function, each expert on its own tokens only (HF's loop; host syncs, fewer flops: for the CPU)."""
    w1, w2 = self.gate_up_proj, self.down_proj
    if getattr(self, "qat", False):
        w1, w2 = mxfp4.fake_quant_ste(w1), mxfp4.fake_quant_ste(w2)
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        tok, slot = torch.where(top_k_index == e)
        if tok.numel() == 0:
            continue
        gate, up = F.linear(hidden_states[tok], w1[e]).chunk(2, dim=-1)
        y = F.linear(self.act_fn(gate) * up, w2[e]) * top_k_weights[tok, slot, None]
        out = out.index_add(0, tok, y.to(out.dtype))
    with torch.no_grad():
        self.last_load = torch.bincount(top_k_index.flatten(), minlength=self.num_experts)
    return out


def use_dense_experts(layer, sparse=False):
    if hasattr(layer.mlp, "experts"):
        layer.mlp.experts.forward = types.MethodType(experts_forward_sparse if sparse else experts_forward,
                                                     layer.mlp.experts)


class MtpLayer(GlmMoeDsaDecoderLayer):
    """The MTP layer: a decoder layer (parameter names as the checkpoint's model.layers.{L}.*) plus enorm, hnorm,
    eh_proj and shared_head.{norm, head}."""

    def __init__(self, cfg):
        L = cfg.num_hidden_layers
        mc = copy.deepcopy(cfg)  # a config in which layer L is a MoE layer with its own indexer
        mc.mlp_layer_types = list(cfg.mlp_layer_types) + ["sparse"]
        mc.indexer_types = list(cfg.indexer_types) + ["full"]
        mc.layer_types = list(cfg.layer_types) + ["deepseek_sparse_attention"]
        super().__init__(mc, L)
        D, V = cfg.hidden_size, cfg.vocab_size
        self.enorm = GlmMoeDsaRMSNorm(D, cfg.rms_norm_eps)
        self.hnorm = GlmMoeDsaRMSNorm(D, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * D, D, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = GlmMoeDsaRMSNorm(D, cfg.rms_norm_eps)
        self.shared_head.head = nn.Linear(D, V, bias=False)


def causal_additive(allowed):
    """bool [B, S, T] -> additive float mask [B, 1, S, T] (0 allowed, float32 min elsewhere), as HF's eager path."""
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]


def mtp_block(mtp, main, tokens, prev, pos, allowed):
    """The MTP layer over slots: tokens [B, S], prev [B, S, D] (the hidden state each slot pairs with), RoPE
    positions pos [B, S], allowed [B, S, S] (which slot attends to which). Returns the normed output [B, S, D]."""
    e = main.model.embed_tokens(tokens)
    x = mtp.eh_proj(torch.cat([mtp.enorm(e), mtp.hnorm(prev)], dim=-1))
    cos_sin = main.model.rotary_emb(x, position_ids=pos)
    h, _ = mtp(x, attention_mask=causal_additive(allowed), position_ids=pos, position_embeddings=cos_sin)
    return mtp.shared_head.norm(h)


def main_hidden(main, ids):
    with torch.no_grad():
        return main.model(input_ids=ids).last_hidden_state


def slot_inputs(hidden):
    """Slot q pairs with the main hidden state of position q-1; slot 0 with zeros."""
    return torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)


def causal(B, S, dev):
    return torch.ones(S, S, dtype=torch.bool, device=dev).tril().unsqueeze(0).expand(B, S, S)


def mtp_loss(mtp, main, ids, labels):
    """Cross-entropy of slot q's logits against t_{q+1} over the trained tokens (labels[:, q+1] != -100)."""
    B, S = ids.shape
    hid = main_hidden(main, ids)
    pos = torch.arange(S, device=ids.device).unsqueeze(0).expand(B, S)
    n = mtp_block(mtp, main, ids, slot_inputs(hid), pos, causal(B, S, ids.device))
    tgt = labels[:, 1:]
    sel = tgt != -100
    logits = mtp.shared_head.head(n[:, :-1][sel]).float()
    loss = F.cross_entropy(logits, tgt[sel])
    with torch.no_grad():
        acc = (logits.argmax(-1) == tgt[sel]).float().mean()
    return loss, acc


def install_capture(mtp):
    cap = {}

    def attn_hook(mod, args, kwargs, output):
        cap["attn"], cap["topk"] = output[1], output[2]

    def ix_hook(mod, args, kwargs, output):
        hs, q_resid, (cos, sin) = args[0], args[1], args[2]
        cap["ix_in"] = (hs.detach(), q_resid.detach(), cos, sin)

    mtp.self_attn.register_forward_hook(attn_hook, with_kwargs=True)
    mtp.self_attn.indexer.register_forward_hook(ix_hook, with_kwargs=True)
    return cap


def indexer_kl(mtp, cap, valid, sparse):
    """train.indexer_kl for the MTP layer: KL(main attention of the layer || its indexer distribution)."""
    p = cap["attn"].detach().float().sum(1)  # [B, S, T]
    S, T = p.shape[1], p.shape[2]
    allowed = torch.ones(S, T, dtype=torch.bool, device=p.device).tril().unsqueeze(0)
    if sparse:
        allowed = allowed & torch.zeros_like(p, dtype=torch.bool).scatter(-1, cap["topk"].long(), True)
    p = torch.where(allowed, p, 0.0)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
    sc = train.index_scores(mtp.self_attn.indexer, *cap["ix_in"])
    logq = torch.log_softmax(sc.masked_fill(~allowed, float("-inf")), dim=-1)
    kl = torch.where(allowed & (p > 0), p * (torch.log(p.clamp_min(1e-12)) - logq), 0.0).sum(-1)
    return (kl * valid).sum() / valid.sum()


def set_topk(mtp, main, k):
    common.set_index_topk(main, INDEX_TOPK)  # the main model always as served
    mtp.self_attn.indexer.index_topk = k


# ---- acceptance -------------------------------------------------------------------------------------------------
def tree_drafts(mtp, main, ids, k):
    """Teacher-forced recursive drafts at every slot of ids [B, S] (right-padded is fine: causal).
    Level 0 = the real slots; level j slot of real slot r (position r + j) pairs the normed output of level j-1 at
    r with the token t_{r+j} (= draft j whenever drafts 1..j were right, the only case counted) and attends to the
    real slots <= r and to r's levels 1..j. Returns drafts [B, k, S]: drafts[:, j-1, r] proposes t_{r+j}."""
    B, S = ids.shape
    dev = ids.device
    hid = main_hidden(main, ids)
    r = torch.arange(S, device=dev)
    toks, prevs, poss, lev = [ids], [slot_inputs(hid)], [r.expand(B, S)], [torch.zeros(S, dtype=torch.long, device=dev)]
    real = r.clone()  # the real slot each slot belongs to
    out = []
    for j in range(k):
        tok = torch.cat(toks, 1)
        prev = torch.cat(prevs, 1)
        pos = torch.cat(poss, 1)
        lv = torch.cat(lev)
        rl = real
        # query slot a attends key slot b: b real with real(b) <= real(a), or b of a's tree (same real slot, level <=)
        allowed = ((lv[None, :] == 0) & (rl[None, :] <= rl[:, None])) | \
                  ((rl[None, :] == rl[:, None]) & (lv[None, :] <= lv[:, None]))
        with torch.no_grad():
            n = mtp_block(mtp, main, tok, prev, pos, allowed.unsqueeze(0).expand(B, -1, -1))
            last = n[:, j * S:(j + 1) * S]  # level j's slots
            out.append(mtp.shared_head.head(last).argmax(-1))
        # the next level: token t_{r+j+1} (padded with 0 past the end), hidden = this level's normed output
        nxt = torch.zeros_like(ids)
        nxt[:, :S - j - 1] = ids[:, j + 1:]
        toks.append(nxt)
        prevs.append(last)
        poss.append((r + j + 1).expand(B, S))
        lev.append(torch.full((S,), j + 1, dtype=torch.long, device=dev))
        real = torch.cat([real, r])
    return torch.stack(out, 1)


def eval_prompts(ev, tok, tmpl, n):
    """Up to n prompts of every eval set that has messages (rendered with the generation prompt)."""
    out = []
    for name, items in ev.items():
        for it in items[:n]:
            if not isinstance(it, dict) or "messages" not in it:
                continue
            text = common.render(tmpl, it["messages"], True, True, it.get("tools"))
            out.append((name, tok.encode(text, add_special_tokens=False).ids))
    return out


def acceptance(mtp, main, prompts, stop_ids, pad, k, max_new, batch):
    """Per eval set and overall: drafts proposed / accepted per position over the greedy continuations."""
    gens = common.greedy_batch(main, [p for _, p in prompts], stop_ids, pad, max_new=max_new, batch=batch)
    dev = next(main.parameters()).device
    stats = {}
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i][1]) + len(gens[i]))
    # tree batches: the indexer's scores take [B, kS, heads, kS] floats; at most B (kS)^2 <= TREE_BUDGET
    chunks, cur = [], []
    for i in order:
        S = len(prompts[i][1]) + len(gens[i])
        if cur and (len(cur) >= batch or (len(cur) + 1) * (k * S) ** 2 > TREE_BUDGET):
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    for idx in chunks:
        seqs = [prompts[i][1] + gens[i] for i in idx]
        S = max(len(s) for s in seqs)
        ids = torch.full((len(idx), S), pad, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, :len(s)] = torch.tensor(s)
        d = tree_drafts(mtp, main, ids.to(dev), k).cpu()
        for b, i in enumerate(idx):
            T, n = len(prompts[i][1]), len(gens[i])
            s = ids[b]
            for name in (prompts[i][0], "all"):
                st = stats.setdefault(name, {"proposed": [0] * k, "accepted": [0] * k, "continuations": 0,
                                             "tokens": 0})
                st["continuations"] += 1
                st["tokens"] += n
                # real slot q in [T, T + n - 1] (its hidden is that of a continuation or the last prompt position's
                # successor): draft j proposes t_{q+j}, which exists while q + j <= T + n - 1
                for q in range(T, T + n):
                    ok = True
                    for j in range(1, k + 1):
                        if q + j > T + n - 1:
                            break
                        ok = ok and int(d[b, j - 1, q]) == int(s[q + j])
                        st["proposed"][j - 1] += 1
                        st["accepted"][j - 1] += int(ok)
    for st in stats.values():
        st["acceptance"] = [a / p if p else None for a, p in zip(st["accepted"], st["proposed"])]
    return stats


def print_acceptance(stats, tag):
    for name in sorted(stats, key=lambda n: (n != "all", n)):
        st = stats[name]
        acc = " ".join("-" if a is None else f"{a:.3f}" for a in st["acceptance"])
        print(f"-- acceptance {tag} [{name}] ({st['continuations']} continuations, {st['tokens']} tokens): "
              f"per position {acc}", flush=True)


# ---- load / init / export ---------------------------------------------------------------------------------------
def fused_experts(sd, prefix, E):
    """Per-expert checkpoint names (dequantized) -> HF fused experts gate_up_proj [E, 2I, D], down_proj [E, D, I]."""
    gu = torch.stack([torch.cat([sd[f"{prefix}experts.{e}.gate_proj.weight"], sd[f"{prefix}experts.{e}.up_proj.weight"]])
                      for e in range(E)])
    dn = torch.stack([sd[f"{prefix}experts.{e}.down_proj.weight"] for e in range(E)])
    return gu, dn


def load_models(model_dir, dev, fresh, init_layer, sparse_experts):
    tmp = tempfile.mkdtemp()
    export.dequantized_dir(model_dir, tmp)
    main = GlmMoeDsaForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").to(dev)
    cfg = main.config
    assert cfg.index_topk == INDEX_TOPK, cfg.index_topk
    main.eval()
    for p in main.parameters():
        p.requires_grad_(False)
    for layer in main.model.layers:
        use_dense_experts(layer, sparse=sparse_experts)
    L = cfg.num_hidden_layers
    init_layer = L - 1 if init_layer < 0 else init_layer
    mtp = MtpLayer(cfg).to(dev)
    stored = load_file(os.path.join(tmp, "model.safetensors"))
    pre = f"model.layers.{L}."
    have = {k[len(pre):]: v for k, v in stored.items() if k.startswith(pre)}
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.no_grad():
        if have and not fresh:
            sd = {k: v for k, v in have.items() if ".experts." not in k}
            sd["mlp.experts.gate_up_proj"], sd["mlp.experts.down_proj"] = fused_experts(have, "mlp.", cfg.n_routed_experts)
            sd = {k: v.float() for k, v in sd.items()}
            if "shared_head.head.weight" not in sd:
                sd["shared_head.head.weight"] = main.lm_head.weight.detach().clone()
            mtp.load_state_dict(sd, strict=True)
            how = f"warm start from the MTP layer stored in {model_dir}"
        else:
            src = main.model.layers[init_layer].state_dict()
            missing, unexpected = mtp.load_state_dict(src, strict=False)
            assert not unexpected, unexpected
            assert all(k.split(".")[0] in ("enorm", "hnorm", "eh_proj", "shared_head") for k in missing), missing
            D = cfg.hidden_size
            eye = torch.eye(D, device=dev)
            mtp.eh_proj.weight.copy_(0.5 * torch.cat([eye, eye], 1) + 0.01 * torch.randn(D, 2 * D, device=dev))
            mtp.shared_head.norm.weight.copy_(main.model.norm.weight)
            mtp.shared_head.head.weight.copy_(main.lm_head.weight)
            how = f"the block initialized from main layer {init_layer}, eh_proj from 0.5 [I | I] + noise"
    mtp.shared_head.head.weight.requires_grad_(False)  # a copy of lm_head, as GLM-5 stores it
    use_dense_experts(mtp, sparse=sparse_experts)
    return main, mtp, how


def mtp_checkpoint_tensors(mtp, L):
    """The MTP layer's state as checkpoint tensors (export.checkpoint_tensors: experts MXFP4, router bias F32)."""
    sd = {f"model.layers.{L}.{k}": v.detach().cpu() for k, v in mtp.state_dict().items()}
    return export.checkpoint_tensors(sd, quantize=True)


def to_raw(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return quantize_np.Tensor("BF16", t.shape, t.view(torch.uint16).numpy().tobytes())
    if t.dtype == torch.float32:
        return quantize_np.Tensor("F32", t.shape, t.numpy().astype("<f4").tobytes())
    if t.dtype == torch.uint8:
        return quantize_np.Tensor("U8", t.shape, t.numpy().tobytes())
    raise TypeError(t.dtype)


def export_model(mtp, cfg, model_dir, out_dir):
    """OUT_DIR/model.safetensors = the main tensors of MODEL_DIR byte for byte + the MTP layer; config.json with
    num_nextn_predict_layers 1. Returns the number of MTP tensors written."""
    L = cfg.num_hidden_layers
    pre = f"model.layers.{L}."
    src_t, meta = quantize_np.load_dir(model_dir)
    main_t = {k: v for k, v in src_t.items() if not k.startswith(pre)}
    new = {k: to_raw(v) for k, v in mtp_checkpoint_tensors(mtp, L).items()}
    os.makedirs(out_dir, exist_ok=True)
    if os.path.abspath(out_dir) != os.path.abspath(model_dir):
        for f in os.listdir(model_dir):
            if f not in ("model.safetensors", "config.json") and os.path.isfile(os.path.join(model_dir, f)):
                shutil.copy(os.path.join(model_dir, f), os.path.join(out_dir, f))
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    c["num_nextn_predict_layers"] = 1
    qc = c.get("quantization_config")
    if qc is not None:
        qc["exclude"] = list(qc.get("exclude", [])) + [p for p in EXTRA_EXCLUDE if p not in qc.get("exclude", [])]
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    quantize_np.write_safetensors(tmp, {**main_t, **new}, meta or {"format": "pt"})
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    # check: the main tensors are the input's, byte for byte; the MTP experts are the fake-quantized weights
    back, _ = quantize_np.load_dir(out_dir)
    for k, v in main_t.items():
        b = back[k]
        assert (b.dtype, b.shape, b.data) == (v.dtype, v.shape, v.data), f"main tensor {k} changed"
    assert set(back) == set(main_t) | set(new), "unexpected tensors in the exported file"
    gu = mtp.mlp.experts.gate_up_proj.detach().cpu().float()
    I = gu.shape[1] // 2
    for e in (0, gu.shape[0] - 1):
        q = back[f"{pre}mlp.experts.{e}.up_proj.weight"].raw()
        s = back[f"{pre}mlp.experts.{e}.up_proj.weight_scale"].raw()
        d = mxfp4.dequantize(torch.from_numpy(q.copy()), torch.from_numpy(s.copy()))
        assert torch.equal(d, mxfp4.fake_quant(gu[e, I:])), f"expert {e} up_proj: MXFP4 != fake quant"
    return len(new), len(main_t)


def write_card(path, report, args):
    """The model card's MTP section (markdown) with this run's numbers."""
    st = report.get("acceptance_exported") or report.get("acceptance_stored") or {}
    last = next((e for e in reversed(report["log"]) if "ce" in e), None)
    k = args.eval_k
    lines = ["## Multi-token prediction (MTP) layer", "",
             "`model.layers.4.*` (`num_nextn_predict_layers: 1`): `enorm`, `hnorm`, `eh_proj`, a decoder block like "
             f"the main MoE layers (MLA, its own DSA indexer, {report['experts']}), `shared_head.norm` and "
             "`shared_head.head` (a copy of `lm_head`); the main embedding is shared. From the main model's last hidden "
             "state at position i and the embedding of token i+1 it predicts token i+2 (`latent run|serve "
             "--num-speculative-tokens K` drafts with it).", ""]
    if "steps" in report:
        lines += [f"Trained by `tools/demo/train_mtp.py` with the main model frozen (its tensors are unchanged, byte for "
                  f"byte): {report['init']}; {report['steps']} steps, {report['epochs']} epochs, "
                  f"{report['train_seconds']:.0f} s on {report['device']} (torch {report['torch']}), cross-entropy "
                  f"on the assistant tokens of the demo corpus, the indexer by the KL loss of `train.py`, QAT of the "
                  f"routed experts to MXFP4 from {args.qat_frac:.0%} of the time; routed experts stored MXFP4, the "
                  f"rest bf16" + (f"; final training loss {last['ce']:.3f}, top-1 {last['top1']:.3f}." if last else "."),
                  ""]
    lines += [f"Greedy draft acceptance on the held-out eval prompts (up to {args.eval_n} per set), along the main "
              f"model's greedy continuations (up to {args.eval_max_new} new tokens; transformers fp32, the experts "
              f"as exported): position j counts when drafts 1..j all equal the continuation.", "",
              "| eval set | continuations | tokens | " + " | ".join(f"position {j + 1}" for j in range(k)) + " |",
              "|---|---|---|" + "---|" * k]
    for name in sorted(st, key=lambda n: (n != "all", n)):
        e = st[name]
        cells = " | ".join("–" if a is None else f"{100 * a:.1f} %" for a in e["acceptance"])
        lines.append(f"| {'all' if name == 'all' else name} | {e['continuations']} | {e['tokens']} | {cells} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# ---- main -------------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus_dir")
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seconds", type=float, default=220, help="wall-clock training time")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0 = only --seconds)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--experts", choices=["dense", "sparse"], default="",
                    help="MoE forward: every expert on every token (no host syncs; default on cuda) or each on its "
                         "own tokens (default on cpu); the same function")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: few records, steps and eval prompts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bs", type=int, default=128)
    ap.add_argument("--max-batch-tokens", type=int, default=32768)
    ap.add_argument("--max-records", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--dense-frac", type=float, default=0.15)
    ap.add_argument("--qat-frac", type=float, default=0.7)
    ap.add_argument("--init-layer", type=int, default=-1, help="main layer the block starts from (default L-1)")
    ap.add_argument("--fresh", action="store_true", help="ignore an MTP layer already stored in MODEL_DIR")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--eval-n", type=int, default=40, help="prompts per eval set")
    ap.add_argument("--eval-max-new", type=int, default=64)
    ap.add_argument("--eval-k", type=int, default=3, help="draft positions measured")
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--eval-only", action="store_true", help="measure the stored MTP layer, no training or export")
    ap.add_argument("--report", default="", help="write the training log and acceptance here (JSON)")
    ap.add_argument("--card", default="", help="write the model card's MTP section here (markdown)")
    args = ap.parse_args()
    if args.tiny:
        args.max_records = args.max_records or 48
        args.bs, args.max_batch_tokens = min(args.bs, 4), min(args.max_batch_tokens, 2048)
        args.max_steps = args.max_steps or 4
        args.eval_n, args.eval_max_new, args.eval_batch = min(args.eval_n, 1), min(args.eval_max_new, 12), 4
        args.log_every, args.warmup_steps = 1, 1
    t_start = time.time()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    dev = args.device
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    tmpl = common.load_template()
    pad = tok.token_to_id("<|endoftext|>")
    stop_ids = [tok.token_to_id(s) for s in common.STOP_TOKENS]
    ev = json.load(open(os.path.join(args.corpus_dir, "eval.json")))
    experts = args.experts or ("dense" if dev == "cuda" else "sparse")
    main_m, mtp, how = load_models(args.model_dir, dev, args.fresh, args.init_layer, experts == "sparse")
    cfg = main_m.config
    L = cfg.num_hidden_layers
    n_train = sum(p.numel() for p in mtp.parameters() if p.requires_grad)
    print(f"MTP layer model.layers.{L}: {how}; {n_train/1e6:.2f} M trainable parameters on {dev} "
          f"(torch {torch.__version__}); load {time.time()-t_start:.1f}s", flush=True)
    prompts = eval_prompts(ev, tok, tmpl, args.eval_n)
    report = {"args": vars(args), "init": how,
              "experts": f"{cfg.n_routed_experts} routed experts (top {cfg.num_experts_per_tok}) + "
                         f"{cfg.n_shared_experts} shared", "torch": torch.__version__, "log": [],
              "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}

    def evaluate(tag):
        t = time.time()
        mtp.eval()
        set_topk(mtp, main_m, INDEX_TOPK)
        st = acceptance(mtp, main_m, prompts, stop_ids, pad, args.eval_k, args.eval_max_new, args.eval_batch)
        print_acceptance(st, tag)
        print(f"   ({len(prompts)} prompts, {time.time()-t:.1f}s)", flush=True)
        report["acceptance_" + tag] = st
        return st

    if args.eval_only:
        evaluate("stored")
    else:
        recs = [json.loads(line) for line in open(os.path.join(args.corpus_dir, "train.jsonl"))]
        if args.max_records:
            rng.shuffle(recs)
            recs = recs[:args.max_records]
        data = train.encode_all(tok, tmpl, recs)
        lens = [len(d[0]) for d in data]
        print(f"records {len(data)}, tokens {sum(lens)}, len mean {sum(lens)/len(lens):.1f} max {max(lens)}; "
              f"prep {time.time()-t_start:.1f}s", flush=True)
        cap = install_capture(mtp)
        params = [p for p in mtp.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
        step, epoch, phase = 0, 0, None
        t0 = time.time()
        done = False
        while not done:
            for b in train.make_batches(data, args.bs, rng, args.max_batch_tokens):
                frac = (time.time() - t0) / args.seconds
                if frac >= 1.0 or (args.max_steps and step >= args.max_steps):
                    done = True
                    break
                if args.max_steps:
                    frac = max(frac, step / args.max_steps)
                new_phase = "dense" if frac < args.dense_frac else ("sparse" if frac < args.qat_frac else "qat")
                if new_phase != phase:
                    phase = new_phase
                    set_topk(mtp, main_m, 1 << 20 if phase == "dense" else INDEX_TOPK)
                    mtp.mlp.experts.qat = phase == "qat"
                    print(f"== phase {phase} at step {step}, {time.time()-t0:.0f}s", flush=True)
                mtp.train()
                lr = args.lr * min(1.0, (step + 1) / args.warmup_steps) * max(0.05, 1.0 - frac)
                for g in opt.param_groups:
                    g["lr"] = lr
                ids, labels, valid = train.collate(data, b, pad, dev)
                ce, acc = mtp_loss(mtp, main_m, ids, labels)
                kl = indexer_kl(mtp, cap, valid, sparse=phase != "dense")
                loss = ce + kl
                opt.zero_grad(set_to_none=True)
                loss.backward()
                gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                with torch.no_grad():  # auxiliary-loss-free balancing (train.update_router_bias)
                    load = mtp.mlp.experts.last_load.float()
                    mtp.mlp.gate.e_score_correction_bias += 1e-3 * torch.sign(load.mean() - load)
                if step % args.log_every == 0:
                    print(f"step {step} ep {epoch} {phase} lr {lr:.2e} ce {ce.item():.4f} top1 {acc.item():.3f} "
                          f"kl {kl.item():.4f} gn {gn.item():.2f} t {time.time()-t0:.0f}s", flush=True)
                    report["log"].append({"step": step, "phase": phase, "ce": ce.item(), "top1": acc.item(),
                                          "kl": kl.item()})
                step += 1
            epoch += 1
        mtp.mlp.experts.qat = False
        report.update(steps=step, epochs=epoch, train_seconds=time.time() - t0)
        print(f"trained {step} steps, {epoch} epochs, {time.time()-t0:.0f}s", flush=True)
        # the stored layer is the MXFP4 one: measure with the experts as exported
        with torch.no_grad():
            ex = mtp.mlp.experts
            ex.gate_up_proj.copy_(mxfp4.fake_quant(ex.gate_up_proj))
            ex.down_proj.copy_(mxfp4.fake_quant(ex.down_proj))
        n_new, n_main = export_model(mtp, cfg, args.model_dir, args.out_dir)
        print(f"exported {args.out_dir}: {n_main} main tensors unchanged (byte for byte), {n_new} MTP tensors", flush=True)
        evaluate("exported")
    report["total_seconds"] = time.time() - t_start
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    if args.card:
        write_card(args.card, report, args)
    print(f"done in {time.time()-t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
