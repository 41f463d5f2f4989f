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


_PREFIX_IDS = {}
_CALLS = [0]


def encode_text(tok, text):
    """tok.encode(text) with the part before the first `<|user|>` (the long `# Tools` system block) cached: the
    tokenizer splits its input at added tokens first, so encoding the two parts apart gives the same ids."""
    i = text.find(END_OF_TURN)
    if i <= 0:
        return tok.encode(text, add_special_tokens=False).ids
    head = text[:i]
    if head not in _PREFIX_IDS:
        _PREFIX_IDS[head] = tok.encode(head, add_special_tokens=False).ids
    ids = _PREFIX_IDS[head] + tok.encode(text[i:], add_special_tokens=False).ids
    _CALLS[0] += 1
    if _CALLS[0] % 101 == 1:  # spot check of the split against a whole encoding
        assert ids == tok.encode(text, add_special_tokens=False).ids, text
    return ids


def encode_record(tok, template, rec):
    """Returns (ids, spans): the full training sequence and the [start, end) token spans the loss covers.
    A record may give "tools" (the request's tool list) and "end" (the token ending the trained turn:
    `<|observation|>` after tool calls, END_OF_TURN otherwise): then the last message is trained. Or "train":
    [[message index, end token], ...], several assistant turns of one conversation (the last one last), each
    trained from its generation prompt to its end token; what lies between (tool results) is not trained."""
    msgs, think, tools = rec["messages"], rec.get("enable_thinking", True), rec.get("tools")
    turns = rec.get("train") or [[len(msgs) - 1, rec.get("end", END_OF_TURN)]]
    assert turns[-1][0] == len(msgs) - 1, "the last trained turn must be the last message"
    spans, f_ids = [], []
    for k, end in turns:
        assert msgs[k]["role"] == "assistant", k
        prompt = render(template, msgs[:k], True, think, tools)
        full = render(template, msgs[:k + 1], False, think, tools) + end
        assert full.startswith(prompt), (prompt, full)
        p_ids = encode_text(tok, prompt)
        prev = f_ids
        f_ids = encode_text(tok, full)
        assert f_ids[:len(p_ids)] == p_ids, (prompt, full)
        assert f_ids[:len(prev)] == prev, "an earlier trained turn is not a prefix of the conversation"
        assert not spans or len(p_ids) >= spans[-1][1], k
        spans.append((len(p_ids), len(f_ids)))
    return f_ids, spans


def split_reply(text):
    """Generated text after the `<think>` of the prompt -> (reasoning, content)."""
    for s in STOP_TOKENS:
        text = text.split(s)[0]
    if "</think>" in text:
        r, c = text.split("</think>", 1)
        return r.strip(), c.strip()
    return "", text.strip()


def greedy_batch(model, prompts, stop_ids, pad_id, max_new=64, batch=64, method=None):
    """Greedy decoding. method "recompute" (the default): no KV cache, right-padded batches, full recompute each
    step; exact per sequence (causal attention, causal DSA selection, per-token routing), fast on a GPU. method
    "generate" (or DEMO_GREEDY=generate): transformers generate with its KV cache, one prompt at a time, the
    faster way on a CPU. Returns the new ids per prompt (ending with the stop id when one was produced)."""
    import torch
    method = method or os.environ.get("DEMO_GREEDY", "recompute")
    with torch.no_grad():
        if method == "generate":
            dev = next(model.parameters()).device
            out = []
            for p in prompts:
                g = model.generate(torch.tensor([p], device=dev), attention_mask=torch.ones(1, len(p), dtype=torch.long,
                                   device=dev), max_new_tokens=max_new, do_sample=False, eos_token_id=stop_ids,
                                   pad_token_id=pad_id)
                out.append(g[0, len(p):].tolist())
            return out
        assert method == "recompute", method
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
