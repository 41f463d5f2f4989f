#!/usr/bin/env python3
"""Measures latent-demo accuracy (before/after MXFP4, dense vs sparse DSA) and writes greedy fixtures.

usage: eval_fixtures.py CKPT MODEL_DIR CORPUS_DIR FIXTURE_DIR
  CKPT         train.py output (fp32 master weights: the "before MXFP4" model)
  MODEL_DIR    exported directory (experts MXFP4; loaded into the HF fp32 model with dequantized experts)
Writes FIXTURE_DIR/greedy.json (transformers generate, greedy, fp32, eager attention) and
FIXTURE_DIR/accuracy.json.
"""
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import export  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer, GlmMoeDsaConfig, GlmMoeDsaForCausalLM  # noqa: E402

DENSE = 1 << 20
N_FIXTURE_CAPITALS = int(os.environ.get("DEMO_FX_N", "40"))


def acc_table(model, tok, tmpl, ev, stop_ids, pad, topk_cfg, full):
    r = {}
    for mode, k in (("dense", DENSE), ("sparse", topk_cfg)):
        common.set_index_topk(model, k)
        sets = ["capitals_heldout", "capitals_long"] + (["arithmetic", "units", "general"] if full else [])
        for s in sets:
            a, res = common.evaluate(model, tok, tmpl, ev[s], stop_ids, pad)
            r[f"{s}/{mode}"] = {"accuracy": a, "n": len(res), "correct": sum(x["correct"] for x in res)}
            if s.startswith("capitals") and mode == "sparse":
                r[f"{s}/{mode}"]["wrong"] = [(x["expect"], x["content"]) for x in res if not x["correct"]][:20]
        # non-thinking mode on the held-out capitals
        a, res = common.evaluate(model, tok, tmpl, ev["capitals_heldout"], stop_ids, pad, thinking=False)
        r[f"capitals_heldout_nothink/{mode}"] = {"accuracy": a, "n": len(res)}
    common.set_index_topk(model, topk_cfg)
    return r


def main():
    ckpt_path, model_dir, corpus_dir, fx_dir = sys.argv[1:5]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 reference numerics
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(fx_dir, exist_ok=True)
    ev = json.load(open(os.path.join(corpus_dir, "eval.json")))
    if os.environ.get("DEMO_EVAL_N"):
        n = int(os.environ["DEMO_EVAL_N"])
        ev = {k: v[:n] for k, v in ev.items()}
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tmpl = common.load_template(os.path.join(model_dir, "chat_template.jinja"))
    stop_ids = [tok.token_to_id(s) for s in common.STOP_TOKENS]
    pad = stop_ids[0]
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__}
    t0 = time.time()

    # before MXFP4: fp32 master weights (DEMO_SKIP_BEFORE=1 or DEMO_SKIP_TABLES=1 leave this table out)
    ck = export.load_ckpt(ckpt_path)
    cfg = GlmMoeDsaConfig(**ck["config"])
    topk_cfg = cfg.index_topk
    if not (os.environ.get("DEMO_SKIP_BEFORE") or os.environ.get("DEMO_SKIP_TABLES")):
        m0 = GlmMoeDsaForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
        m0.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ck["state_dict"].items()})
        m0.to(dev).eval()
        out["before_mxfp4"] = acc_table(m0, tok, tmpl, ev, stop_ids, pad, topk_cfg, full=False)
        del m0
        print(f"before: {time.time()-t0:.0f}s", flush=True)
    out["greedy_method"] = os.environ.get("DEMO_GREEDY", "recompute")

    # after MXFP4: the exported directory, experts dequantized, HF fp32 eager
    tmp = export.dequantized_dir(model_dir, tempfile.mkdtemp())
    model = GlmMoeDsaForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").to(dev)
    model.eval()
    if not os.environ.get("DEMO_SKIP_TABLES"):  # DEMO_SKIP_TABLES=1: fixtures only (a CPU run's time saver)
        out["after_mxfp4"] = acc_table(model, tok, tmpl, ev, stop_ids, pad, topk_cfg, full=True)
    print(f"after: {time.time()-t0:.0f}s", flush=True)

    # fixtures: transformers generate (greedy, KV cache) from the exported directory
    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    items = [{"name": "france", "messages": [{"role": "user", "content": "What is the capital of France?"}],
              "expect": "Paris", "enable_thinking": True}]
    items += [dict(name=f"heldout_{i}", enable_thinking=True, **it)
              for i, it in enumerate(ev["capitals_heldout"][:N_FIXTURE_CAPITALS])]
    items += [dict(name=f"long_{i}", enable_thinking=True, **it) for i, it in enumerate(ev["capitals_long"][:6])]
    items += [dict(name=f"nothink_{i}", enable_thinking=False, **it)
              for i, it in enumerate(ev["capitals_heldout"][50:53])]
    recs = []
    greedy_prompts = []
    for it in items:
        kw = {} if it["enable_thinking"] else {"enable_thinking": False}
        text = hf_tok.apply_chat_template(it["messages"], add_generation_prompt=True, tokenize=False, **kw)
        mine = common.render(tmpl, it["messages"], True, it["enable_thinking"])
        assert text == mine, (text, mine)
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        assert ids == tok.encode(text, add_special_tokens=False).ids
        x = torch.tensor([ids], device=dev)
        with torch.no_grad():
            g = model.generate(x, max_new_tokens=int(os.environ.get("DEMO_MAX_NEW", "64")), do_sample=False, eos_token_id=stop_ids, pad_token_id=pad)
        gen = g[0, len(ids):].tolist()
        dec = hf_tok.decode(gen, skip_special_tokens=False)
        reasoning, content = common.split_reply(dec)
        recs.append({"name": it["name"], "messages": it["messages"], "enable_thinking": it["enable_thinking"],
                     "prompt": text, "prompt_ids": ids, "generated_ids": gen, "text": dec,
                     "reasoning": reasoning if it["enable_thinking"] else "", "content": content,
                     "expect": it["expect"], "correct": it["expect"].lower() in content.lower()})
        greedy_prompts.append(ids)
    nocache = common.greedy_batch(model, greedy_prompts, stop_ids, pad, max_new=int(os.environ.get("DEMO_MAX_NEW", "64")),
                                  method="recompute")
    agree = sum(a == r["generated_ids"] for a, r in zip(nocache, recs))
    caps = [r for r in recs if r["name"].startswith("heldout_")]
    fx = {
        "model": "models/latent-demo", "generator": "transformers GlmMoeDsaForCausalLM.generate",
        "transformers": __import__("transformers").__version__, "torch": torch.__version__,
        "dtype": "float32 (MXFP4 experts dequantized exactly)", "attn_implementation": "eager",
        "tf32": False, "index_topk": topk_cfg, "max_new_tokens": 64, "do_sample": False,
        "eos_token_id": stop_ids,
        "heldout_capitals_accuracy": sum(r["correct"] for r in caps) / len(caps),
        "all_accuracy": sum(r["correct"] for r in recs) / len(recs),
        "nocache_batched_greedy_agreement": f"{agree}/{len(recs)}",
        "items": recs,
    }
    with open(os.path.join(fx_dir, "greedy.json"), "w") as f:
        json.dump(fx, f, ensure_ascii=False, indent=1)
    out["fixtures"] = {k: v for k, v in fx.items() if k != "items"}
    out["eval_seconds"] = time.time() - t0
    with open(os.path.join(fx_dir, "accuracy.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print(json.dumps({k: (v if k != "before_mxfp4" and k != "after_mxfp4" else
                          {a: b["accuracy"] for a, b in v.items()}) for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
