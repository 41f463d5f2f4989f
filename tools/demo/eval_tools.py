#!/usr/bin/env python3
"""Tool-call and JSON-answer accuracy of latent-demo in transformers (greedy, fp32, MXFP4 experts dequantized).

usage: eval_tools.py MODEL_DIR CORPUS_DIR OUT_JSON
A tool item is correct when the reply's `<tool_call>` blocks name exactly the expected tools with exactly the
expected arguments (values compared after JSON typing, as the server's GLM parser types them); a JSON item when the
reply parses as the expected object.
"""
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
ARG_RE = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def typed(tools, name, key, v):
    for t in tools:
        f = t["function"]
        if f["name"] == name and f["parameters"]["properties"].get(key, {}).get("type") == "string":
            return v
    try:
        return json.loads(v)
    except ValueError:
        return v


def parse_calls(text, tools):
    calls = []
    for body in CALL_RE.findall(text):
        name = body.split("<arg_key>")[0].strip()
        calls.append({"name": name, "arguments": {k.strip(): typed(tools, name, k.strip(), v)
                                                  for k, v in ARG_RE.findall(body)}})
    return calls


def same_calls(got, want):
    key = lambda c: json.dumps(c, sort_keys=True)  # noqa: E731
    return sorted(map(key, got)) == sorted(map(key, want))


def main():
    import torch
    from tokenizers import Tokenizer
    from transformers import GlmMoeDsaForCausalLM
    import export
    model_dir, corpus_dir, out_json = sys.argv[1:4]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ev = json.load(open(os.path.join(corpus_dir, "eval.json")))
    if os.environ.get("DEMO_EVAL_N"):  # a quick run on the first N items of each set
        ev = {k: v[:int(os.environ["DEMO_EVAL_N"])] for k, v in ev.items()}
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tmpl = common.load_template(os.path.join(model_dir, "chat_template.jinja"))
    stop_ids = [tok.token_to_id(s) for s in common.STOP_TOKENS]
    tmp = export.dequantized_dir(model_dir, tempfile.mkdtemp())
    model = GlmMoeDsaForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").to(dev).eval()
    t0 = time.time()
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}
    items = ev["tools"]
    prompts = [tok.encode(common.render(tmpl, it["messages"], True, True, it["tools"]), add_special_tokens=False).ids
               for it in items]
    gens = common.greedy_batch(model, prompts, stop_ids, stop_ids[0], max_new=110, batch=32)
    per_kind, wrong, names_ok = {}, [], 0
    for it, g in zip(items, gens):
        text = tok.decode(g, skip_special_tokens=False)
        got = parse_calls(text, it["tools"])
        ok = same_calls(got, it["expect_calls"])
        names_ok += sorted(c["name"] for c in got) == sorted(c["name"] for c in it["expect_calls"])
        k = per_kind.setdefault(it["kind"], [0, 0])
        k[0] += ok
        k[1] += 1
        if not ok:
            wrong.append({"q": it["messages"][0]["content"], "text": text})
    n_ok = sum(v[0] for v in per_kind.values())
    out["tool_calls"] = {"accuracy": n_ok / len(items), "n": len(items), "correct": n_ok,
                         "per_kind": {k: f"{a}/{b}" for k, a_b in per_kind.items() for a, b in [a_b]},
                         "wrong": wrong[:15]}
    out["tool_names"] = {"accuracy": names_ok / len(items), "n": len(items), "correct": names_ok,
                         "what": "the right tools (and number of calls), arguments not compared"}
    # final answers from the tool results
    ans_prompts = []
    for it in items:
        msgs = list(it["messages"]) + [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": c} for c in it["expect_calls"]]}]
        msgs += [{"role": "tool", "content": json.dumps(r, ensure_ascii=False)} for r in it["results"]]
        ans_prompts.append(tok.encode(common.render(tmpl, msgs, True, True, it["tools"]), add_special_tokens=False).ids)
    gens = common.greedy_batch(model, ans_prompts, stop_ids, stop_ids[0], max_new=80, batch=32)
    ok = sum(common.split_reply(tok.decode(g, skip_special_tokens=False))[1] == it["answer"]
             for it, g in zip(items, gens))
    out["answers_from_results"] = {"accuracy": ok / len(items), "n": len(items), "correct": ok}
    # JSON answers
    items = ev["json"]
    prompts = [tok.encode(common.render(tmpl, it["messages"], True, True), add_special_tokens=False).ids
               for it in items]
    gens = common.greedy_batch(model, prompts, stop_ids, stop_ids[0], max_new=80, batch=32)
    ok = 0
    for it, g in zip(items, gens):
        try:
            ok += json.loads(common.split_reply(tok.decode(g, skip_special_tokens=False))[1]) == it["expect_json"]
        except ValueError:
            pass
    out["json_answers"] = {"accuracy": ok / len(items), "n": len(items), "correct": ok}
    out["eval_seconds"] = time.time() - t0
    with open(out_json, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print(json.dumps({k: v for k, v in out.items()}, indent=1, ensure_ascii=False)[:4000])


if __name__ == "__main__":
    main()
