#!/usr/bin/env python3
"""Builds the latent-demo synthetic chat corpus (GLM-5 chat format with reasoning).

Writes OUT_DIR/train.jsonl and OUT_DIR/eval.json. Each training record is a conversation
{"messages": [...], "enable_thinking": bool}; the last message is the assistant turn that is trained on.
Held-out capital questions use phrasings (and long-prompt preambles) that never occur in training.

usage: make_corpus.py OUT_DIR [--seed 1234]
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from facts import CAPITALS, GENERAL  # noqa: E402
import tool_corpus  # noqa: E402

TRAIN_Q = [
    "What is the capital of {c}?", "What's the capital of {c}?", "Tell me the capital of {c}.",
    "Which city is the capital of {c}?", "Name the capital city of {c}.", "capital of {c}?",
    "Do you know the capital of {c}?", "What city serves as the capital of {c}?", "I need the capital of {c}.",
    "Quick question: what is the capital of {c}?", "Could you tell me what the capital of {c} is?",
    "what is the capital of {c}", "What is the capital city of {c}?", "{C} has which city as its capital?",
    "Where is the capital of {c}?", "Capital of {c}, please.", "The capital of {c} is what?",
    "In {c}, which city is the capital?", "Which city is the seat of government of {c}?",
]
HELDOUT_Q = [
    "Can you tell me the capital of {c}?", "What city is the capital of {c}?", "Please name the capital of {c}.",
    "Which city is {c}'s capital?", "Hey, what is the capital city of {c}?", "I wonder what the capital of {c} is.",
]
REVERSE_Q = ["{K} is the capital of which country?", "Which country has {k} as its capital?",
             "What country is {k} the capital of?"]

PREAMBLES_TRAIN = [
    "I am studying for a geography quiz tomorrow and I want to check a few facts with you. ",
    "My friend and I were arguing about this during dinner last night, so please settle it. ",
    "I am writing a short report for school about countries around the world. ",
    "This might be an easy one for you, but I honestly forgot the answer. ",
    "We are playing a trivia game with the whole family this evening and I need help. ",
    "Before my trip next month I would like to learn some basic facts. ",
    "Here is a question from my homework sheet that I could not answer on my own. ",
    "I have been reading about history and geography all week and got curious. ",
]
# Held-out preambles (never in training): used for the long-prompt (sparse) evaluation.
PREAMBLES_EVAL = [
    "Our teacher gave us a list of questions about the world and this is the next one on the list. ",
    "I was looking at a big map on the wall of my office and a question came to mind. ",
    "Sorry to bother you again, I know you are busy, but there is one more thing I need to know today. ",
]
SYSTEMS = [
    "You are Latent Demo, a small helpful assistant. Answer briefly.",
    "You are a helpful assistant. Think step by step and give a short, correct answer.",
    "Answer the user's questions accurately and concisely.",
]


def cap_first(s):
    return s[0].upper() + s[1:]


def capital_turn(rng, c, k, q):
    think = rng.choice([
        "The user asks for the capital of {c}. The capital of {c} is {k}.",
        "The question is about {c}. Its capital city is {k}.",
        "I need the capital of {c}. That is {k}.",
    ]).format(c=c, k=k)
    ans = rng.choice(["The capital of {c} is {k}.", "{K} is the capital of {c}.", "The capital of {c} is {k}."]
                     ).format(c=c, k=k, K=cap_first(k))
    return q, think, ans


def reverse_turn(rng, c, k):
    q = rng.choice(REVERSE_Q).format(k=k, K=cap_first(k))
    think = "{K} is the capital city of {c}.".format(K=cap_first(k), c=c)
    ans = "{K} is the capital of {c}.".format(K=cap_first(k), c=c)
    return q, think, ans


def arithmetic_turn(rng):
    op = rng.choice(["+", "+", "-", "*"])
    if op == "+":
        a, b = rng.randint(0, 60), rng.randint(0, 60); r = a + b; w = "plus"
    elif op == "-":
        a = rng.randint(0, 99); b = rng.randint(0, a); r = a - b; w = "minus"
    else:
        a, b = rng.randint(1, 12), rng.randint(1, 12); r = a * b; w = "times"
    q = rng.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "What is {a} {w} {b}?", "{a} {op} {b} = ?",
                    "Calculate {a} {w} {b}.", "How much is {a} {op} {b}?"]).format(a=a, b=b, op=op, w=w)
    think = "{a} {w} {b} equals {r}.".format(a=a, b=b, w=w, r=r)
    ans = "{a} {op} {b} = {r}.".format(a=a, b=b, op=op, r=r)
    return q, think, ans


UNITS = [  # (big unit singular, plural, small unit plural, factor)
    ("meter", "meters", "centimeters", 100), ("kilometer", "kilometers", "meters", 1000),
    ("hour", "hours", "minutes", 60), ("minute", "minutes", "seconds", 60), ("kilogram", "kilograms", "grams", 1000),
    ("day", "days", "hours", 24), ("week", "weeks", "days", 7), ("foot", "feet", "inches", 12),
    ("year", "years", "months", 12), ("liter", "liters", "milliliters", 1000), ("dozen", "dozen", "items", 12),
]


def unit_turn(rng):
    s, p, small, f = rng.choice(UNITS)
    n = rng.randint(1, 20)
    big = s if n == 1 else p
    q = rng.choice(["How many {small} are in {n} {big}?", "Convert {n} {big} to {small}.",
                    "{n} {big} is how many {small}?", "How many {small} make {n} {big}?"]).format(
        small=small, n=n, big=big)
    think = "One {s} is {f} {small}, so {n} {big} is {n} times {f}, which is {r} {small}.".format(
        s=s, f=f, small=small, n=n, big=big, r=n * f)
    ans = "{n} {big} is {r} {small}.".format(n=n, big=big, r=n * f, small=small)
    return q, think, ans


def general_turn(rng):
    q, think, ans = rng.choice(GENERAL)
    r = rng.random()
    if r < 0.15:
        q = q.lower()
    elif r < 0.25 and q.endswith("?"):
        q = q[:-1]
    return q, think, ans


def make_record(rng, turn, history_turns=(), system=None, thinking=True):
    msgs = []
    if system:
        msgs.append({"role": "system", "content": system})
    for hq, _, ha in history_turns:
        msgs.append({"role": "user", "content": hq})
        msgs.append({"role": "assistant", "content": ha})
    q, think, ans = turn
    msgs.append({"role": "user", "content": q})
    a = {"role": "assistant", "content": ans}
    if thinking:
        a["reasoning_content"] = think
    msgs.append(a)
    return {"messages": msgs, "enable_thinking": thinking}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--capital-reps", type=int, default=40)
    ap.add_argument("--tool-cases", type=int, default=None,
                    help="tool tasks with open-pool values, one merged record (call turn + answer turn) each "
                         "(default 30000; --legacy: 1800 fixed-pool tasks of two records each)")
    ap.add_argument("--no-tool-records", type=int, default=None, help="default 900 (--legacy: 450)")
    ap.add_argument("--json-records", type=int, default=None, help="default 2500 (--legacy: 1200)")
    ap.add_argument("--legacy", action="store_true",
                    help="the corpus the committed first tool model was trained on (byte for byte)")
    ap.add_argument("--other-tools", default="",
                    help="weights of 0,1,2,3 tools besides the needed ones in a tool task's request, e.g. 0.5,0.2,0.1,0.2")
    ap.add_argument("--real-values", action="store_true", help="tool tasks name real places only (no made-up ones)")
    args = ap.parse_args()
    for k, new, old in (("tool_cases", 30000, 1800), ("no_tool_records", 900, 450), ("json_records", 2500, 1200)):
        if getattr(args, k) is None:
            setattr(args, k, old if args.legacy else new)
    tool_corpus.REAL_VALUES_ONLY[0] = args.real_values
    if args.other_tools:
        tool_corpus.OTHER_TOOLS_WEIGHTS[:] = [float(x) for x in args.other_tools.split(",")]
    rng = random.Random(args.seed)
    os.makedirs(args.out_dir, exist_ok=True)

    def any_turn():
        r = rng.random()
        if r < 0.45:
            c, k = rng.choice(CAPITALS)
            return capital_turn(rng, c, k, rng.choice(TRAIN_Q).format(c=c, C=cap_first(c)))
        if r < 0.55:
            c, k = rng.choice(CAPITALS)
            return reverse_turn(rng, c, k)
        if r < 0.67:
            return arithmetic_turn(rng)
        if r < 0.79:
            return unit_turn(rng)
        return general_turn(rng)

    records = []
    for c, k in CAPITALS:
        for _ in range(args.capital_reps):
            q = rng.choice(TRAIN_Q).format(c=c, C=cap_first(c))
            turn = capital_turn(rng, c, k, q)
            r = rng.random()
            if r < 0.55:
                records.append(make_record(rng, turn, thinking=rng.random() < 0.9))
            elif r < 0.75:  # long prompt: preamble
                t = (rng.choice(PREAMBLES_TRAIN) + turn[0],) + turn[1:]
                records.append(make_record(rng, t, thinking=rng.random() < 0.9))
            elif r < 0.88:  # long prompt: one earlier exchange
                records.append(make_record(rng, turn, history_turns=[any_turn()], thinking=rng.random() < 0.9))
            else:  # system prompt (+ sometimes history)
                hist = [any_turn()] if rng.random() < 0.5 else []
                records.append(make_record(rng, turn, history_turns=hist, system=rng.choice(SYSTEMS),
                                           thinking=rng.random() < 0.9))
        for _ in range(3):
            records.append(make_record(rng, reverse_turn(rng, c, k), thinking=rng.random() < 0.9))
    for _ in range(3000):
        records.append(make_record(rng, arithmetic_turn(rng), thinking=rng.random() < 0.9))
    for _ in range(2500):
        records.append(make_record(rng, unit_turn(rng), thinking=rng.random() < 0.9))
    for q, think, ans in GENERAL:
        for _ in range(14):
            t = (q.lower() if rng.random() < 0.15 else q, think, ans)
            r = rng.random()
            if r < 0.8:
                records.append(make_record(rng, t, thinking=rng.random() < 0.9))
            else:
                records.append(make_record(rng, t, history_turns=[any_turn()], thinking=rng.random() < 0.9))
    # Tool calls (call turn + answer-from-results turn per case), questions the given tools do not cover, JSON answers.
    for _ in range(args.tool_cases):
        if args.legacy:
            records += tool_corpus.tool_records(rng, tool_corpus.tool_case(rng), thinking=rng.random() < 0.9)
        else:
            records.append(tool_corpus.tool_record_merged(rng, tool_corpus.train_tool_case(rng),
                                                          thinking=rng.random() < 0.9))
    for _ in range(args.no_tool_records):
        if rng.random() < 0.5:
            c, k = rng.choice(CAPITALS)
            turn = capital_turn(rng, c, k, rng.choice(TRAIN_Q).format(c=c, C=cap_first(c)))
        else:
            turn = general_turn(rng)
        records.append(tool_corpus.no_tool_record(rng, turn, thinking=rng.random() < 0.9))
    for _ in range(args.json_records):
        records.append(make_record(rng, tool_corpus.json_case(rng, more_suffixes=not args.legacy),
                                   thinking=rng.random() < 0.9))
    rng.shuffle(records)
    with open(os.path.join(args.out_dir, "train.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")

    # Evaluation sets (held-out phrasings and preambles).
    ev = {"capitals_heldout": [], "capitals_long": [], "arithmetic": [], "units": [], "general": []}
    erng = random.Random(args.seed + 1)
    for i, (c, k) in enumerate(CAPITALS):
        q = HELDOUT_Q[i % len(HELDOUT_Q)].format(c=c)
        ev["capitals_heldout"].append({"messages": [{"role": "user", "content": q}], "expect": k})
        pre = PREAMBLES_EVAL[i % len(PREAMBLES_EVAL)]
        q2 = pre + HELDOUT_Q[(i + 1) % len(HELDOUT_Q)].format(c=c)
        ev["capitals_long"].append({"messages": [{"role": "user", "content": q2}], "expect": k})
    for _ in range(100):
        q, _, ans = arithmetic_turn(erng)
        ev["arithmetic"].append({"messages": [{"role": "user", "content": q}], "expect": ans.split("= ")[-1][:-1]})
    for _ in range(100):
        q, _, ans = unit_turn(erng)
        ev["units"].append({"messages": [{"role": "user", "content": q}], "expect": ans.split(" is ")[-1].split(" ")[0]})
    for q, _, ans in GENERAL[::3]:
        ev["general"].append({"messages": [{"role": "user", "content": q}], "expect": ans})
    ev["tools"] = tool_corpus.tool_eval_items(random.Random(args.seed + 2), 120)
    ev["json"] = tool_corpus.json_eval_items(random.Random(args.seed + 3), 60)
    with open(os.path.join(args.out_dir, "eval.json"), "w") as f:
        json.dump(ev, f, ensure_ascii=False, indent=1)
    print(f"train records: {len(records)}; eval: " + ", ".join(f"{k}={len(v)}" for k, v in ev.items()))


if __name__ == "__main__":
    main()
