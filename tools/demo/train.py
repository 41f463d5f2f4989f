#!/usr/bin/env python3
"""Trains the latent-demo glm_moe_dsa model (transformers GlmMoeDsaForCausalLM) on the synthetic chat corpus.

Phases (fractions of --seconds of wall-clock training; --dense-frac 0.35 and --qat-frac 0.8 by default):
  1. dense   [0, 0.35): LM loss with index_topk >= sequence length (DSA selects everything) + indexer KL warm-up
  2. sparse  [0.35, 0.8): index_topk = config value (16) active, LM loss + indexer KL on the selected keys
  3. qat     [0.8, 1.0): as 2, routed-expert weights fake-quantized to MXFP4 (straight-through estimator)
With --init MODEL_DIR training continues from an exported model (its MXFP4 experts dequantized exactly, the other
weights as stored in bf16) instead of a fresh initialization.
The indexer gets no gradient through its top-k; as in DeepSeek-V3.2 it is trained only by a KL loss pulling
softmax(index scores) toward the main attention distribution (summed over heads, L1-normalized), with the
indexer inputs detached so that loss does not touch the main model.
Routing uses DeepSeek's auxiliary-loss-free balancing (e_score_correction_bias nudged toward equal load).

usage: train.py CORPUS_DIR TOKENIZER_DIR OUT_CKPT [--seconds 240] [--seed 0] [--tiny] [--init MODEL_DIR]
Writes OUT_CKPT/ (meta.json with config and log, fp32 state shards) for export.py.
"""
import argparse
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import mxfp4  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM  # noqa: E402
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave  # noqa: E402

INDEX_TOPK = 16


def make_config(vocab, tiny=False, **ids):
    c = dict(vocab_size=vocab, hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
             q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
             n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
             routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
             index_n_heads=16, index_head_dim=32, index_topk=INDEX_TOPK, indexer_types=["full"] * 4,
             rms_norm_eps=1e-5, max_position_embeddings=2048, initializer_range=0.02, tie_word_embeddings=False,
             num_nextn_predict_layers=0, hidden_act="silu", attention_bias=False,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **ids)
    if tiny:
        c.update(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=4,
                 num_hidden_layers=2, indexer_types=["full"] * 2, q_lora_rank=32, kv_lora_rank=32)
    return GlmMoeDsaConfig(**c)


# ---- MoE experts forward used in training: every expert on every token, weighted by the sparse routing matrix.
# Same function as HF's per-expert loop; no host syncs; optional MXFP4 fake quantization of the weights.
STATE = {"fake_quant": False, "loads": {}}


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    w1, w2 = self.gate_up_proj, self.down_proj
    if STATE["fake_quant"]:
        w1, w2 = mxfp4.fake_quant_ste(w1), mxfp4.fake_quant_ste(w2)
    h = torch.einsum("nd,efd->enf", hidden_states, w1)
    gate, up = h.chunk(2, dim=-1)
    y = torch.einsum("eni,edi->end", self.act_fn(gate) * up, w2)
    r = torch.zeros(hidden_states.shape[0], self.num_experts, device=h.device, dtype=top_k_weights.dtype)
    r = r.scatter(1, top_k_index, top_k_weights)
    with torch.no_grad():
        STATE["loads"][id(self)] = torch.bincount(top_k_index.flatten(), minlength=self.num_experts)
    return torch.einsum("end,ne->nd", y, r.to(y.dtype))


def index_scores(ix, hs, q_resid, cos, sin):
    """Differentiable copy of GlmMoeDsaIndexer's score computation -> [B, S, T] (no mask)."""
    B, S, _ = hs.shape
    q = ix.wq_b(q_resid).view(B, S, ix.n_heads, ix.head_dim)
    q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    k = ix.k_norm(ix.wk(hs)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    sc = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
    w = ix.weights_proj(hs).float() * (ix.n_heads ** -0.5)
    return torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)


def install_hooks(model, dense_experts=True):
    cap = {}
    for li, layer in enumerate(model.model.layers):
        attn = layer.self_attn

        def attn_hook(mod, args, kwargs, output, li=li):
            cap.setdefault(li, {})["attn"] = output[1]
            cap[li]["topk"] = output[2]

        def ix_hook(mod, args, kwargs, output, li=li):
            hs, q_resid, (cos, sin) = args[0], args[1], args[2]
            cap.setdefault(li, {})["ix_in"] = (hs.detach(), q_resid.detach(), cos, sin)

        attn.register_forward_hook(attn_hook, with_kwargs=True)
        if attn.indexer is not None:
            attn.indexer.register_forward_hook(ix_hook, with_kwargs=True)
        if dense_experts and hasattr(layer.mlp, "experts"):
            layer.mlp.experts.forward = types.MethodType(dense_experts_forward, layer.mlp.experts)
    return cap


def lm_loss(model, ids, labels):
    """Mean next-token cross-entropy over the labelled positions, lm_head applied only there (the same value as
    the model's own loss with labels=, without the logits of every position)."""
    h = model.model(input_ids=ids).last_hidden_state
    tgt = labels[:, 1:]
    sel = tgt != -100
    logits = model.lm_head(h[:, :-1][sel]).float()
    return F.cross_entropy(logits, tgt[sel])


def indexer_kl(model, cap, valid, sparse):
    """Mean KL(main attention || indexer distribution) over valid query rows and indexer layers."""
    total, n = 0.0, 0
    for li, layer in enumerate(model.model.layers):
        ix = layer.self_attn.indexer
        if ix is None:
            continue
        c = cap[li]
        p = c["attn"].detach().float().sum(1)  # [B, S, T]
        S, T = p.shape[1], p.shape[2]
        allowed = torch.ones(S, T, dtype=torch.bool, device=p.device).tril().unsqueeze(0)
        if sparse:
            sel = torch.zeros_like(p, dtype=torch.bool).scatter(-1, c["topk"].long(), True)
            allowed = allowed & sel
        p = torch.where(allowed, p, 0.0)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
        sc = index_scores(ix, *c["ix_in"])
        logq = torch.log_softmax(sc.masked_fill(~allowed, float("-inf")), dim=-1)
        kl = torch.where(allowed & (p > 0), p * (torch.log(p.clamp_min(1e-12)) - logq), 0.0).sum(-1)
        total = total + (kl * valid).sum() / valid.sum()
        n += 1
    return total / max(n, 1)


def update_router_bias(model, u=1e-3):
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "experts"):
                load = STATE["loads"].get(id(layer.mlp.experts))
                if load is None:
                    continue
                load = load.float()
                layer.mlp.gate.e_score_correction_bias += u * torch.sign(load.mean() - load)


def make_batches(data, bs, rng, max_tokens=0):
    """Length-bucketed batches: shuffle, sort chunks of 50 batches by length, split into batches of at most bs
    sequences and (when max_tokens > 0) at most max_tokens padded tokens, so that long tool-call conversations
    come in smaller batches."""
    idx = list(range(len(data)))
    rng.shuffle(idx)
    out = []
    chunk = bs * 50
    for c0 in range(0, len(idx), chunk):
        part = sorted(idx[c0:c0 + chunk], key=lambda i: len(data[i][0]))
        cur = []
        for i in part:
            if cur and (len(cur) >= bs or (max_tokens and (len(cur) + 1) * len(data[i][0]) > max_tokens)):
                out.append(cur)
                cur = []
            cur.append(i)
        if cur:
            out.append(cur)
    rng.shuffle(out)
    return out


def collate(data, b, pad, dev):
    L = max(len(data[i][0]) for i in b)
    ids = torch.full((len(b), L), pad, dtype=torch.long)
    labels = torch.full((len(b), L), -100, dtype=torch.long)
    valid = torch.zeros(len(b), L)
    for j, i in enumerate(b):
        f, spans = data[i]
        ids[j, :len(f)] = torch.tensor(f)
        for s0, s1 in spans:
            labels[j, s0:s1] = torch.tensor(f[s0:s1])
        valid[j, :len(f)] = 1
    return ids.to(dev), labels.to(dev), valid.to(dev)


_ENC = {}


def _encode_one(rec):
    return common.encode_record(_ENC["tok"], _ENC["tmpl"], rec)


def encode_all(tok, tmpl, recs):
    """common.encode_record over all records, on all cores (fork: the workers inherit tokenizer and template)."""
    _ENC.update(tok=tok, tmpl=tmpl)
    n = os.cpu_count() or 1
    if n == 1 or len(recs) < 2000:
        return [_encode_one(r) for r in recs]
    with multiprocessing.get_context("fork").Pool(n) as pool:
        return pool.map(_encode_one, recs, chunksize=256)


def load_init(model_dir, dev):
    """The exported model as an fp32 training model: MXFP4 experts dequantized exactly (export.dequantized_dir)."""
    import export
    tmp = export.dequantized_dir(model_dir, tempfile.mkdtemp())
    model = GlmMoeDsaForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").to(dev)
    assert model.config.index_topk == INDEX_TOPK, model.config.index_topk
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus_dir")
    ap.add_argument("tok_dir")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-batch-tokens", type=int, default=20480)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--max-records", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--eval-n", type=int, default=64)
    ap.add_argument("--eval-max-new", type=int, default=64)
    ap.add_argument("--init", default="", help="continue training this exported model directory")
    ap.add_argument("--dense-frac", type=float, default=0.35)
    ap.add_argument("--qat-frac", type=float, default=0.8)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--freeze-experts", action="store_true",
                    help="routed experts and their routing bias stay as loaded (exactly their MXFP4 values with --init); "
                         "HF's own top-k expert forward, no QAT needed (for short CPU fine-tunes)")
    ap.add_argument("--no-indexer-kl", action="store_true", help="no indexer KL loss (the indexer stays as loaded)")
    ap.add_argument("--attention-only", action="store_true", help="train only the attention (not the indexer)")
    ap.add_argument("--save-every", type=float, default=0, help="also write the checkpoint every this many seconds")
    args = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    tok = Tokenizer.from_file(os.path.join(args.tok_dir, "tokenizer.json"))
    tmpl = common.load_template()
    pad = tok.token_to_id("<|endoftext|>")
    stop_ids = [tok.token_to_id(s) for s in common.STOP_TOKENS]
    recs = [json.loads(line) for line in open(os.path.join(args.corpus_dir, "train.jsonl"))]
    if args.max_records:
        recs = recs[:args.max_records]
    data = encode_all(tok, tmpl, recs)
    lens = [len(d[0]) for d in data]
    print(f"records {len(data)}, tokens {sum(lens)}, len mean {sum(lens)/len(lens):.1f} max {max(lens)}; "
          f"prep {time.time()-t_start:.1f}s", flush=True)
    ev = json.load(open(os.path.join(args.corpus_dir, "eval.json")))

    if args.init:
        model = load_init(args.init, dev)
        cfg = model.config
        print(f"warm start from {args.init}", flush=True)
    else:
        cfg = make_config(tok.get_vocab_size(), tiny=args.tiny, pad_token_id=pad, bos_token_id=None,
                          eos_token_id=stop_ids)
        model = GlmMoeDsaForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32).to(dev)
    model.train()
    if args.freeze_experts:
        for layer in model.model.layers:
            if hasattr(layer.mlp, "experts"):
                for p in layer.mlp.experts.parameters():
                    p.requires_grad_(False)
    if args.no_indexer_kl:
        for layer in model.model.layers:
            if layer.self_attn.indexer is not None:
                for p in layer.self_attn.indexer.parameters():
                    p.requires_grad_(False)
    if args.attention_only:
        for n, p in model.named_parameters():
            if ".self_attn." not in n or ".indexer." in n:
                p.requires_grad_(False)
    cap = install_hooks(model, dense_experts=not args.freeze_experts)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params/1e6:.2f} M on {dev}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and p.requires_grad]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 and p.requires_grad]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    warm = args.warmup_steps

    def write_ckpt(step, epoch):
        """The fp32 state as trained so far (the model's index_topk is restored to the config value by then)."""
        save_ckpt(args.out, {"config": cfg.to_dict(), "log": log, "steps": step, "epochs": epoch,
                             "train_seconds": time.time() - t0, "seed": args.seed, "args": vars(args),
                             "n_params": n_params, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                             "torch": torch.__version__},
                  model.state_dict())
        print(f"checkpoint at step {step} ({time.time()-t0:.0f}s)", flush=True)

    step, epoch, phase = 0, 0, None
    t0 = t_saved = time.time()
    log = []
    done = False
    while not done:
        for b in make_batches(data, args.bs, rng, args.max_batch_tokens):
            frac = (time.time() - t0) / args.seconds
            if frac >= 1.0:
                done = True
                break
            new_phase = "dense" if frac < args.dense_frac else ("sparse" if frac < args.qat_frac else "qat")
            if new_phase != phase:
                if phase is not None:
                    model.eval()
                    set_eval(model, ev, tok, tmpl, stop_ids, pad, phase, step, log, args)
                    model.train()
                phase = new_phase
                common.set_index_topk(model, 1 << 20 if phase == "dense" else INDEX_TOPK)
                STATE["fake_quant"] = phase == "qat" and not args.freeze_experts
                print(f"== phase {phase} at step {step}, {time.time()-t0:.0f}s", flush=True)
            lr = args.lr * min(1.0, (step + 1) / warm) * max(0.05, 1.0 - frac)
            for g in opt.param_groups:
                g["lr"] = lr
            ids, labels, valid = collate(data, b, pad, dev)
            lm = lm_loss(model, ids, labels)
            kl = lm.new_zeros(()) if args.no_indexer_kl else indexer_kl(model, cap, valid, sparse=phase != "dense")
            loss = lm + kl
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            opt.step()
            if not args.freeze_experts:
                update_router_bias(model)
            if step % args.log_every == 0:
                print(f"step {step} ep {epoch} {phase} lr {lr:.2e} lm {lm.item():.4f} kl {kl.item():.4f} "
                      f"gn {gn.item():.2f} t {time.time()-t0:.0f}s", flush=True)
                log.append({"step": step, "phase": phase, "lm": lm.item(), "kl": kl.item()})
            step += 1
            if args.save_every and time.time() - t_saved > args.save_every:
                write_ckpt(step, epoch)
                t_saved = time.time()
        epoch += 1
    model.eval()
    set_eval(model, ev, tok, tmpl, stop_ids, pad, phase, step, log, args)
    print(f"trained {step} steps, {epoch} epochs, {time.time()-t0:.0f}s", flush=True)
    for layer in model.model.layers:  # restore HF experts forward before saving
        if hasattr(layer.mlp, "experts") and "forward" in vars(layer.mlp.experts):
            del layer.mlp.experts.forward
    common.set_index_topk(model, INDEX_TOPK)
    write_ckpt(step, epoch)


def save_ckpt(out_dir, meta, sd, shard_bytes=12 << 20):
    """Directory checkpoint: meta.json + state-K.safetensors shards (fp32), each at most ~12 MiB."""
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        v = v.detach().cpu().contiguous()
        if cur and size + v.numel() * v.element_size() > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += v.numel() * v.element_size()
    shards.append(cur)
    for i, sh in enumerate(shards):
        save_file(sh, os.path.join(out_dir, f"state-{i}.safetensors"))
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)


def set_eval(model, ev, tok, tmpl, stop_ids, pad, phase, step, log, args):
    t = time.time()
    items = ev["capitals_heldout"][:args.eval_n]
    common.set_index_topk(model, 1 << 20)
    acc_d, _ = common.evaluate(model, tok, tmpl, items, stop_ids, pad)
    common.set_index_topk(model, INDEX_TOPK)
    acc_s, res = common.evaluate(model, tok, tmpl, items, stop_ids, pad)
    acc_l, _ = common.evaluate(model, tok, tmpl, ev["capitals_long"][:args.eval_n], stop_ids, pad)
    print(f"-- eval after {phase} (step {step}): heldout capitals dense {acc_d:.3f} sparse {acc_s:.3f}; "
          f"long-prompt sparse {acc_l:.3f}  ({time.time()-t:.1f}s) e.g. {res[0]['text']!r}", flush=True)
    log.append({"step": step, "eval_after": phase, "dense": acc_d, "sparse": acc_s, "long_sparse": acc_l})


if __name__ == "__main__":
    main()
