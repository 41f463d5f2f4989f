#!/usr/bin/env python3
"""Checks a model's MTP layer with latent (numpy only, no torch): what tools/demo/train_mtp.py exports must pass.

  1. the main model's tensors are those of --base byte for byte (when --base is given);
  2. `latent logits --mtp-out` (the MTP layer's logits of every slot) agrees with the fp64 numpy reference
     tools/mtp_reference.py (mtp_slots, from latent's own head-input hidden rows), on each prompt followed by
     latent's greedy continuation;
  3. greedy `latent run` gives the same tokens with --num-speculative-tokens 1, 2, 3 as without speculation
     (a plain prompt with --ignore-eos, and --chat), and prints the acceptance latent measured.

usage: check_mtp.py MODEL_DIR [--latent BIN] [--base BASE_MODEL_DIR] [--prompt TEXT ...] [--max-tokens N]
Exit status 0 when every check passes. Prompts are chat-rendered when the model has a tokenizer and a chat
template; without a tokenizer give --prompt-tokens.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import mtp_reference as ref  # noqa: E402
import quantize_np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_PROMPTS = ["What is the capital of Portugal?", "What is 17 plus 25?",
                   "Give me the capital of Kenya in JSON. Answer in JSON."]


def latent(binary, *args):
    p = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"latent {' '.join(map(str, args[:3]))} ... failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def first_ids(p):
    line = p.stdout.splitlines()[0] if p.stdout.strip() else ""
    return [int(t) for t in line.split()]


def check_main_tensors(model_dir, base_dir):
    T, _ = quantize_np.load_dir(model_dir)
    B, _ = quantize_np.load_dir(base_dir)
    bad = [k for k, v in B.items() if k not in T or (T[k].dtype, T[k].shape, T[k].data) != (v.dtype, v.shape, v.data)]
    extra = sorted(set(T) - set(B))
    print(f"[main tensors] {len(B) - len(bad)}/{len(B)} identical to {base_dir}; {len(extra)} more tensors "
          f"({extra[0] if extra else '-'} ...)")
    return not bad


def check_reference(binary, model_dir, prompts, max_new, tol_rel):
    """latent's MTP logits of every slot vs the numpy reference from latent's hidden rows."""
    cfg, W = ref.load(model_dir)
    geo = ref.Geometry(cfg)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for label, ids in prompts:
            cont = first_ids(latent(binary, "run", "--model", model_dir, "--prompt-tokens", " ".join(map(str, ids)),
                                    "--max-tokens", max_new))
            toks = ids + cont
            lo, hi, mo = (os.path.join(tmp, f) for f in ("l.npy", "h.npy", "m.npy"))
            latent(binary, "logits", "--model", model_dir, "--tokens", " ".join(map(str, toks)), "--out", lo,
                   "--hidden", hi, "--mtp-out", mo)
            got = np.load(mo).astype(np.float64)
            hid = np.load(hi).astype(np.float64)[-1]
            stats = {}
            want, _ = ref.mtp_slots(W, geo, toks, hid, stats)
            err = np.abs(got - want).max(axis=1)
            scale = max(1.0, float(np.abs(want).max()))
            rows_bad = int((err > tol_rel * scale).sum())
            top1 = float((got.argmax(1) == want.argmax(1)).mean())
            margins = {k: round(float(v), 5) for k, v in stats.items()}
            print(f"[reference] {label!r}: {len(toks)} slots, max |latent - numpy| {err.max():.2e} "
                  f"(max |logit| {scale:.1f}), rows over {tol_rel:g}*scale: {rows_bad}, top-1 agreement {top1:.3f}; "
                  f"reference margins {margins}")
            # a row may differ where a discrete decision (DSA top-k, routing) is a near-tie; say so, fail otherwise
            near_tie = stats.get("index_rel_gap", 1.0) < 1e-4 or stats.get("router_margin", 1.0) < 1e-4
            if rows_bad and not near_tie:
                ok = False
    return ok


def check_speculation(binary, model_dir, prompts, max_new, chat_texts):
    ok = True
    for label, ids in prompts:
        base = ["run", "--model", model_dir, "--prompt-tokens", " ".join(map(str, ids)), "--max-tokens", max_new,
                "--ignore-eos"]
        plain = first_ids(latent(binary, *base))
        for k in (1, 2, 3):
            p = latent(binary, *base, "--num-speculative-tokens", k)
            same = first_ids(p) == plain
            ok = ok and same
            acc = [line for line in p.stderr.splitlines() if "speculative k=" in line]
            print(f"[speculation] {label!r} k={k}: {'same tokens' if same else 'DIFFERENT tokens'} as without "
                  f"({len(plain)} tokens); {acc[-1].split('; ', 1)[-1] if acc else ''}")
    for text in chat_texts:
        outs = {}
        for k in (0, 1, 2, 3):
            p = latent(binary, "run", "--model", model_dir, "--chat", text, "--num-speculative-tokens", k)
            outs[k] = p.stdout
        same = all(v == outs[0] for v in outs.values())
        ok = ok and same
        print(f"[speculation] --chat {text!r} k=1,2,3: {'same text' if same else 'DIFFERENT text'} as k=0: "
              f"{outs[0].strip()[-80:]!r}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--latent", default=os.environ.get("LATENT_BIN", os.path.join(ROOT, "build", "cpu", "latent")))
    ap.add_argument("--base", help="the model without its MTP layer: the main tensors must be its, byte for byte")
    ap.add_argument("--prompt", action="append", help="chat prompt text (repeatable)")
    ap.add_argument("--prompt-tokens", action="append", help="prompt ids (repeatable; models without a tokenizer)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--tol", type=float, default=2e-4, help="per-row max error relative to max(1, max |logit|)")
    a = ap.parse_args()
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("num_nextn_predict_layers", 0) < 1:
        raise SystemExit(f"{a.model_dir}: no MTP layer (num_nextn_predict_layers {cfg.get('num_nextn_predict_layers', 0)})")
    prompts, chat = [], []
    for t in a.prompt_tokens or []:
        prompts.append((f"ids: {t}", [int(x) for x in t.replace(",", " ").split()]))
    if not a.prompt_tokens:
        from tokenizers import Tokenizer
        sys.path.insert(0, HERE)
        import common
        tok = Tokenizer.from_file(os.path.join(a.model_dir, "tokenizer.json"))
        tmpl = common.load_template(os.path.join(a.model_dir, "chat_template.jinja"))
        chat = a.prompt or DEFAULT_PROMPTS
        for text in chat:
            r = common.render(tmpl, [{"role": "user", "content": text}], True)
            prompts.append((text, tok.encode(r, add_special_tokens=False).ids))
    ok = True
    if a.base:
        ok = check_main_tensors(a.model_dir, a.base) and ok
    ok = check_reference(a.latent, a.model_dir, prompts, a.max_tokens, a.tol) and ok
    ok = check_speculation(a.latent, a.model_dir, prompts, a.max_tokens, chat) and ok
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
