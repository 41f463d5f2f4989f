#!/usr/bin/env python3
"""CPU-only consistency check of the latent-demo fixtures against the shipped tokenizer and template.

usage: check_fixtures.py [MODEL_DIR] [FIXTURE_JSON]    (needs tokenizers + jinja2, no torch)
Checks: prompts re-render byte-for-byte from chat_template.jinja, prompt ids = tokenizer.json encode,
decode(generated ids) = recorded text, generation ends on an EOS id or at max_new_tokens, the France
chat has non-empty reasoning and "Paris" in the content, and held-out capital accuracy >= 90 %.
"""
import json
import os
import sys

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import load_template, render, split_reply  # noqa: E402


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "models/latent-demo")
    fx_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "tests/golden/latent-demo/greedy.json")
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tmpl = load_template(os.path.join(model_dir, "chat_template.jinja"))
    gen_cfg = json.load(open(os.path.join(model_dir, "generation_config.json")))
    fx = json.load(open(fx_path))
    eos = set(gen_cfg["eos_token_id"])
    assert eos == set(fx["eos_token_id"])
    n_caps = ok_caps = 0
    for it in fx["items"]:
        p = render(tmpl, it["messages"], True, it["enable_thinking"])
        assert p == it["prompt"], (it["name"], p)
        assert tok.encode(p, add_special_tokens=False).ids == it["prompt_ids"], it["name"]
        g = it["generated_ids"]
        assert tok.decode(g, skip_special_tokens=False) == it["text"], it["name"]
        assert g[-1] in eos or len(g) == fx["max_new_tokens"], it["name"]
        r, c = split_reply(it["text"])
        assert c == it["content"], it["name"]
        good = it["expect"].lower() in c.lower()
        if it["name"] == "france":
            assert r and "Paris" in c, it
        if it["name"].startswith("heldout_"):
            n_caps += 1
            ok_caps += good
    acc = ok_caps / n_caps
    assert n_caps >= 30 and acc >= 0.9, (n_caps, acc)
    print(f"ok: {len(fx['items'])} fixtures, held-out capitals {ok_caps}/{n_caps}")


if __name__ == "__main__":
    main()
