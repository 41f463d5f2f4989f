#!/usr/bin/env python3
"""Tool-call and JSON-answer accuracy of latent-demo measured through a running `latent serve` (official openai client,
greedy): the held-out tool tasks of make_corpus.py's eval.json with all four tools and tool_choice auto.

usage: eval_tools_api.py BASE_URL EVAL_JSON [OUT_JSON]
A tool item is correct when message.tool_calls names exactly the expected tools with exactly the expected arguments
(json.loads of `arguments`); an answer item when the reply to the expected calls' results equals the expected
sentence; a JSON item when the reply parses as the expected object.
"""
import json
import sys
import time

import openai


def main():
    base, eval_path = sys.argv[1:3]
    ev = json.load(open(eval_path))
    c = openai.OpenAI(base_url=base, api_key="none")
    model = c.models.list().data[0].id
    t0 = time.time()
    per_kind, wrong, n_ok, ans_ok, names_ok = {}, [], 0, 0, 0
    for it in ev["tools"]:
        r = c.chat.completions.create(model=model, messages=it["messages"], tools=it["tools"], tool_choice="auto",
                                      temperature=0, max_tokens=120)
        m = r.choices[0].message
        got = sorted(json.dumps({"name": t.function.name, "arguments": json.loads(t.function.arguments)}, sort_keys=True)
                     for t in (m.tool_calls or []))
        want = sorted(json.dumps(x, sort_keys=True) for x in it["expect_calls"])
        ok = got == want and r.choices[0].finish_reason == "tool_calls"
        names_ok += sorted(t.function.name for t in (m.tool_calls or [])) == sorted(x["name"] for x in it["expect_calls"])
        k = per_kind.setdefault(it["kind"], [0, 0])
        k[0] += ok
        k[1] += 1
        n_ok += ok
        if not ok:
            wrong.append({"q": it["messages"][0]["content"], "want": want, "got": got, "content": m.content})
        # the final answer from the expected calls' results
        calls = [{"id": f"call_{i}", "type": "function",
                  "function": {"name": x["name"], "arguments": json.dumps(x["arguments"])}}
                 for i, x in enumerate(it["expect_calls"])]
        msgs = list(it["messages"]) + [{"role": "assistant", "content": "", "tool_calls": calls}]
        msgs += [{"role": "tool", "tool_call_id": f"call_{i}", "content": json.dumps(res, ensure_ascii=False)}
                 for i, res in enumerate(it["results"])]
        a = c.chat.completions.create(model=model, messages=msgs, tools=it["tools"], temperature=0, max_tokens=100)
        ans_ok += (a.choices[0].message.content or "").strip() == it["answer"]
    js_ok = 0
    for it in ev["json"]:
        r = c.chat.completions.create(model=model, messages=it["messages"], temperature=0, max_tokens=80)
        try:
            js_ok += json.loads(r.choices[0].message.content or "") == it["expect_json"]
        except ValueError:
            pass
    n, nj = len(ev["tools"]), len(ev["json"])
    out = {"via": "latent serve + openai client, temperature 0, all four tools, tool_choice auto",
           "tool_calls": {"accuracy": n_ok / n, "n": n, "correct": n_ok,
                          "per_kind": {k: f"{a}/{b}" for k, (a, b) in per_kind.items()}, "wrong": wrong},
           "tool_names": {"accuracy": names_ok / n, "n": n, "correct": names_ok,
                          "what": "the right tools (and number of calls), arguments not compared"},
           "answers_from_results": {"accuracy": ans_ok / n, "n": n, "correct": ans_ok},
           "json_answers": {"accuracy": js_ok / nj, "n": nj, "correct": js_ok},
           "seconds": round(time.time() - t0, 1)}
    print(json.dumps({k: v for k, v in out.items() if k != "tool_calls"}, indent=1))
    print(json.dumps({k: v for k, v in out["tool_calls"].items() if k != "wrong"}))
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
