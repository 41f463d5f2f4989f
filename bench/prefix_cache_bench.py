#!/usr/bin/env python3
"""Prefix-cache benchmark against a running `latent serve` (a program, not a test: it prints figures).

  python3 bench/prefix_cache_bench.py --url http://127.0.0.1:8000 [--system-tokens 2000] [--requests 32]

Part 1: a shared system prompt of about --system-tokens tokens, then --requests requests with different short user
turns, one after another: time to first token of the first request against the rest, and the prompt tokens the
server computed (prompt tokens - cached tokens, from usage.prompt_tokens_details.cached_tokens).
Part 2: a multi-turn chat of --turns turns (each turn resends the whole conversation): prompt tokens computed per
turn. Run it once against `latent serve` and once against `latent serve --no-prefix-cache` and compare.
Standard library only.
"""
import argparse
import http.client
import json
import random
import statistics
import time
from urllib.parse import urlparse

WORDS = ("model engine token layers experts support measure welcome family stored answer question capital "
         "country river mountain number water light music travel").split()


def chat(url, messages, max_tokens, model):
    u = urlparse(url)
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, usage, text, buf = None, None, "", b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev[6:] == b"[DONE]":
                continue
            j = json.loads(ev[6:])
            if j.get("usage"):
                usage = j["usage"]
            for ch in j.get("choices", []):
                d = ch.get("delta", {})
                piece = (d.get("content") or "") + (d.get("reasoning_content") or "")
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += d.get("content") or ""
    c.close()
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    return {"ttft": ttft if ttft is not None else time.perf_counter() - t0, "prompt": usage["prompt_tokens"],
            "cached": cached, "text": text}


def count_tokens(url, text, model):
    u = urlparse(url)
    body = {"prompt": text}
    if model:
        body["model"] = model
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
    c.request("POST", "/tokenize", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise SystemExit(f"/tokenize: HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)["count"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="")
    ap.add_argument("--system-tokens", type=int, default=2000, help="approximate length of the shared system prompt")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(0)
    # A system prompt of about --system-tokens tokens, measured with the server's own tokenizer (/tokenize).
    words = [rng.choice(WORDS) for _ in range(args.system_tokens)]
    per_word = count_tokens(args.url, " ".join(words[:200]), args.model) / 200.0
    system = " ".join(words[:max(1, int(args.system_tokens / per_word))])

    shared = []
    for i in range(args.requests):
        q = f"Question {i}: what is {rng.randint(2, 99)} plus {rng.randint(2, 99)}?"
        shared.append(chat(args.url, [{"role": "system", "content": system}, {"role": "user", "content": q}],
                           args.max_tokens, args.model))
    first, rest = shared[0], shared[1:]
    computed = [r["prompt"] - r["cached"] for r in shared]

    conv, turns = [], []
    for t in range(args.turns):
        conv.append({"role": "user", "content": f"Turn {t}: tell me about {rng.choice(WORDS)} and {rng.choice(WORDS)}."})
        r = chat(args.url, conv, args.max_tokens, args.model)
        turns.append({"turn": t, "prompt_tokens": r["prompt"], "cached_tokens": r["cached"],
                      "computed_tokens": r["prompt"] - r["cached"], "ttft_ms": round(r["ttft"] * 1e3, 1)})
        conv.append({"role": "assistant", "content": r["text"]})

    out = {
        "shared_system_prompt": {
            "requests": len(shared), "prompt_tokens_each": first["prompt"],
            "ttft_first_ms": round(first["ttft"] * 1e3, 1),
            "ttft_rest_ms": {"mean": round(statistics.mean(r["ttft"] for r in rest) * 1e3, 1) if rest else None,
                             "max": round(max(r["ttft"] for r in rest) * 1e3, 1) if rest else None},
            "prefill_tokens_computed_total": sum(computed),
            "prefill_tokens_computed_first": computed[0],
            "prefill_tokens_computed_rest_mean": round(statistics.mean(computed[1:]), 1) if rest else None,
        },
        "multi_turn": turns,
    }
    if args.json:
        print(json.dumps(out))
        return
    s = out["shared_system_prompt"]
    print(f"shared system prompt: {s['requests']} requests of {s['prompt_tokens_each']} prompt tokens")
    print(f"  TTFT first {s['ttft_first_ms']} ms, rest mean {s['ttft_rest_ms']['mean']} ms "
          f"(max {s['ttft_rest_ms']['max']} ms)")
    print(f"  prefill tokens computed: {s['prefill_tokens_computed_total']} in all; first "
          f"{s['prefill_tokens_computed_first']}, rest mean {s['prefill_tokens_computed_rest_mean']}")
    print("multi-turn chat: turn, prompt tokens, cached, computed, TTFT ms")
    for t in turns:
        print(f"  {t['turn']:2d} {t['prompt_tokens']:6d} {t['cached_tokens']:6d} {t['computed_tokens']:6d} "
              f"{t['ttft_ms']:8.1f}")


if __name__ == "__main__":
    main()
