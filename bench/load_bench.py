#!/usr/bin/env python3
"""Load generator for `latent serve`: N concurrent streaming clients send chat (or completion) requests and the
script reports throughput and latency (a program, not a test: nothing is asserted).

  python3 bench/load_bench.py --url http://127.0.0.1:8000 --concurrency 16 --requests 64 --max-tokens 64

Per request it measures time to first token (first content/reasoning/text delta), inter-token latency (between
deltas; one delta is one token for this server), end-to-end time and the usage counts (stream_options.include_usage).

Interference mode (--long-prompts N): the --concurrency streams decode continuously (each worker sends request after
request of --max-tokens, ignoring EOS) while, after --warmup seconds, N prompts of --long-prompt-words words arrive
one every --long-interval seconds (max_tokens 1). It reports the streams' inter-token latency alone (gaps that end
before the first long prompt is sent) and during the long prompts (gaps that overlap the time from the first one's
send to the last one's end), their ratio (chunked prefill should keep it within ~2x), and the long prompts' time to
first token. Standard library only.
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlparse


def one_request(url, args, rng, prompt_words=None, max_tokens=None):
    u = urlparse(url)
    words = ["model", "engine", "token", "layers", "experts", "support", "measure", "welcome", "family", "stored"]
    prompt = " ".join(rng.choice(words) for _ in range(prompt_words or args.prompt_words))
    if args.endpoint == "chat":
        path = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": prompt}]}
    else:
        path = "/v1/completions"
        body = {"prompt": prompt}
    body.update({"max_tokens": max_tokens or args.max_tokens, "temperature": args.temperature, "stream": True,
                 "stream_options": {"include_usage": True}, "ignore_eos": args.ignore_eos})
    if args.model:
        body["model"] = args.model
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), headers)
    r = c.getresponse()
    if r.status != 200:
        msg = r.read()[:200]
        c.close()
        return {"error": f"{r.status} {msg!r}"}
    ttft, stamps, usage = None, [], None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            data = ev[6:]
            if data == b"[DONE]":
                break
            j = json.loads(data)
            if j.get("usage"):
                usage = j["usage"]
            for ch in j.get("choices", []):
                d = ch.get("delta", ch)
                if d.get("content") or d.get("reasoning_content") or d.get("text") or d.get("tool_calls"):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    stamps.append(now)
    c.close()
    end = time.perf_counter()
    itl = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft": ttft, "itl": itl, "e2e": end - t0, "usage": usage, "t0": t0, "end": end, "stamps": stamps}


def report(summary, errors, as_json):
    if as_json:
        print(json.dumps(summary))
    else:
        for k, v in summary.items():
            print(f"{k:22s} {v}")
        for e in errors[:5]:
            print("error:", e)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--long-prompts", type=int, default=0, help="interference mode: long prompts to send")
    ap.add_argument("--long-prompt-words", type=int, default=8000)
    ap.add_argument("--long-interval", type=float, default=2.0, help="seconds between long prompts")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of decode alone before the first long prompt")
    args = ap.parse_args()
    if args.long_prompts > 0:
        return interference(args)

    results, lock = [], threading.Lock()
    todo = list(range(args.requests))

    def worker(wid):
        rng = random.Random(args.seed * 1000 + wid)
        while True:
            with lock:
                if not todo:
                    return
                todo.pop()
            res = one_request(args.url, args, rng)
            with lock:
                results.append(res)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    out_tokens = sum((r["usage"] or {}).get("completion_tokens", 0) for r in ok)
    in_tokens = sum((r["usage"] or {}).get("prompt_tokens", 0) for r in ok)
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    e2e = [r["e2e"] for r in ok]
    summary = {
        "requests": len(results), "errors": len(errors), "concurrency": args.concurrency, "wall_s": round(wall, 3),
        "requests_per_s": round(len(ok) / wall, 3), "output_tokens": out_tokens, "prompt_tokens": in_tokens,
        "output_tokens_per_s": round(out_tokens / wall, 1),
        "ttft_ms": {"p50": round(pct(ttft, 50) * 1e3, 1), "p95": round(pct(ttft, 95) * 1e3, 1),
                    "p99": round(pct(ttft, 99) * 1e3, 1)},
        "itl_ms": {"p50": round(pct(itl, 50) * 1e3, 2), "p95": round(pct(itl, 95) * 1e3, 2),
                   "p99": round(pct(itl, 99) * 1e3, 2),
                   "mean": round(statistics.mean(itl) * 1e3, 2) if itl else None},
        "e2e_s": {"p50": round(pct(e2e, 50), 3), "p95": round(pct(e2e, 95), 3), "p99": round(pct(e2e, 99), 3)},
    }
    report(summary, errors, args.json)


def interference(args):
    args.ignore_eos = True
    stop = threading.Event()
    lock = threading.Lock()
    streams, longs, errors = [], [], []

    def decoder(wid):
        rng = random.Random(args.seed * 1000 + wid)
        while not stop.is_set():
            res = one_request(args.url, args, rng)
            with lock:
                (errors if "error" in res else streams).append(res.get("error", res))

    def long_sender(i, rng):
        res = one_request(args.url, args, rng, prompt_words=args.long_prompt_words, max_tokens=1)
        with lock:
            (errors if "error" in res else longs).append(res.get("error", res))

    threads = [threading.Thread(target=decoder, args=(i,)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    time.sleep(args.warmup)
    first_send = time.perf_counter()
    senders = []
    for i in range(args.long_prompts):
        t = threading.Thread(target=long_sender, args=(i, random.Random(args.seed * 7919 + i)))
        t.start()
        senders.append(t)
        if i + 1 < args.long_prompts:
            time.sleep(args.long_interval)
    for t in senders:
        t.join()
    last_end = max([r["end"] for r in longs], default=time.perf_counter())
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()

    alone, during = [], []
    for r in streams:
        st = r["stamps"]
        for a, b in zip(st, st[1:]):
            if b <= first_send:
                alone.append(b - a)
            elif a < last_end:
                during.append(b - a)

    def ms(xs, p):
        return round(pct(xs, p) * 1e3, 2)

    summary = {
        "concurrency": args.concurrency, "long_prompts": len(longs), "errors": len(errors),
        "long_prompt_tokens": [(r["usage"] or {}).get("prompt_tokens") for r in longs],
        "long_ttft_ms": sorted(round(r["ttft"] * 1e3, 1) for r in longs if r["ttft"] is not None),
        "itl_alone_ms": {"n": len(alone), "p50": ms(alone, 50), "p99": ms(alone, 99), "p99.9": ms(alone, 99.9),
                         "max": round(max(alone, default=float("nan")) * 1e3, 2)},
        "itl_during_long_ms": {"n": len(during), "p50": ms(during, 50), "p99": ms(during, 99),
                               "p99.9": ms(during, 99.9), "max": round(max(during, default=float("nan")) * 1e3, 2)},
    }
    if alone and during:
        summary["ratio_p50"] = round(pct(during, 50) / pct(alone, 50), 2)
        summary["ratio_p99"] = round(pct(during, 99) / pct(alone, 99), 2)
    report(summary, errors, args.json)


if __name__ == "__main__":
    main()
