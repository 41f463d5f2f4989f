"""Shared helpers for the latent-demo scripts: template rendering, tokenization, batched greedy decoding."""
import json
import os

from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
STOP_TOKENS = ["<|endoftext|>", "<|user|>", "<|observation|>"]
END_OF_TURN = "<|user|>"  # training answers end with this token (a stop id)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def load_template(path=None):
    """Compiles the chat template like transformers does (ImmutableSandboxedEnvironment, trim/lstrip blocks)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    with open(path or os.path.join(HERE, "chat_template.jinja")) as f:
        return env.from_string(f.read())


def render(template, messages, add_generation_prompt, enable_thinking=True, tools=None):
    kw = {} if enable_thinking else {"enable_thinking": False}
    if tools:
        kw["tools"] = tools
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **kw)


def encode_record(tok, template, rec):
    """Returns (ids, n_prompt): the full training sequence and the length of its prompt part.
    A record may give "tools" (the request's tool list) and "end" (the token ending the trained turn:
    `<|observation|>` after tool calls, END_OF_TURN otherwise)."""
    msgs, think, tools = rec["messages"], rec.get("enable_thinking", True), rec.get("tools")
    prompt = render(template, msgs[:-1], True, think, tools)
    full = render(template, msgs, False, think, tools) + rec.get("end", END_OF_TURN)
    assert full.startswith(prompt), (prompt, full)
    p_ids = tok.encode(prompt, add_special_tokens=False).ids
    f_ids = tok.encode(full, add_special_tokens=False).ids
    assert f_ids[:len(p_ids)] == p_ids, (prompt, full)
    return f_ids, len(p_ids)


def split_reply(text):
    """Generated text after the `<think>` of the prompt -> (reasoning, content)."""
    for s in STOP_TOKENS:
        text = text.split(s)[0]
    if "</think>" in text:
        r, c = text.split("</think>", 1)
        return r.strip(), c.strip()
    return "", text.strip()


def greedy_batch(model, prompts, stop_ids, pad_id, max_new=64, batch=64):
    """Greedy decoding without a KV cache: right-padded batches, full recompute each step.
    Exact per sequence (causal attention, causal DSA selection, per-token routing). Returns new ids per prompt."""
    import torch
    with torch.no_grad():
        return _greedy_batch(torch, model, prompts, stop_ids, pad_id, max_new, batch)


def _greedy_batch(torch, model, prompts, stop_ids, pad_id, max_new, batch):
    dev = next(model.parameters()).device
    out = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    stop = torch.tensor(stop_ids, device=dev)
    for c0 in range(0, len(order), batch):
        idx = order[c0:c0 + batch]
        B = len(idx)
        L = max(len(prompts[i]) for i in idx) + max_new
        ids = torch.full((B, L), pad_id, dtype=torch.long, device=dev)
        lens = torch.zeros(B, dtype=torch.long, device=dev)
        for j, i in enumerate(idx):
            ids[j, :len(prompts[i])] = torch.tensor(prompts[i], device=dev)
            lens[j] = len(prompts[i])
        start = lens.clone()
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        for _ in range(max_new):
            cur = int(lens.max())
            h = model.model(input_ids=ids[:, :cur]).last_hidden_state
            last = h[torch.arange(B, device=dev), lens - 1]
            nxt = model.lm_head(last).argmax(-1)
            write = ~done
            ids[torch.arange(B, device=dev)[write], lens[write]] = nxt[write]
            lens = lens + write.long()
            done = done | torch.isin(nxt, stop)
            if bool(done.all()):
                break
        for j, i in enumerate(idx):
            out[i] = ids[j, start[j]:lens[j]].tolist()
    return out


def set_index_topk(model, k):
    for layer in model.model.layers:
        ix = layer.self_attn.indexer
        if ix is not None:
            ix.index_topk = k


def evaluate(model, tok, template, items, stop_ids, pad_id, thinking=True, max_new=None):
    """items: [{"messages", "expect"}] -> (accuracy, per-item results)."""
    max_new = max_new or int(os.environ.get("DEMO_MAX_NEW", "64"))
    prompts_txt = [render(template, it["messages"], True, thinking, it.get("tools")) for it in items]
    prompts = [tok.encode(p, add_special_tokens=False).ids for p in prompts_txt]
    gens = greedy_batch(model, prompts, stop_ids, pad_id, max_new=max_new)
    res, ok = [], 0
    for it, p, pi, g in zip(items, prompts_txt, prompts, gens):
        text = tok.decode(g, skip_special_tokens=False)
        reasoning, content = split_reply(text)
        good = it["expect"].lower() in content.lower()
        ok += good
        res.append({"prompt": p, "prompt_ids": pi, "generated_ids": g, "text": text, "reasoning": reasoning,
                    "content": content, "expect": it["expect"], "correct": bool(good)})
    return ok / max(len(items), 1), res
