"""Tool-call and JSON-answer conversations for the latent-demo corpus (GLM-5 tool format).

Four tools (tool_defs.json): get_weather, convert_units, calculate, get_capital. A tool-call turn is the
assistant's `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>` (one or two of them: parallel
calls) ending with `<|observation|>`; the next turn sees the results in `<tool_response>` blocks and answers from
them. Requests for a JSON answer get a one-line JSON object. Held-out phrasings (TOOL_HELDOUT_*) never occur in
training; tool_eval_items() builds the tool-call evaluation from them.
"""
import json
import os

from facts import CAPITALS

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "tool_defs.json")) as _f:
    TOOLS = json.load(_f)
TOOL_BY_NAME = {t["function"]["name"]: t for t in TOOLS}
OBSERVATION = "<|observation|>"

CITIES = [k for _, k in CAPITALS if "," not in k] + [
    "New York", "Chicago", "Los Angeles", "Sydney", "Toronto", "Munich", "Milan", "Barcelona", "Osaka", "Shanghai",
    "Mumbai", "Istanbul", "Rio de Janeiro", "Cape Town", "Vancouver", "Hamburg", "Lyon", "Geneva", "Zurich",
    "Boston", "Seattle", "Melbourne", "Kyoto", "Marseille", "Porto", "Florence", "Krakow", "Dubai", "Auckland"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "stormy"]

WEATHER_Q = [
    "What is the weather in {x}?", "What's the weather like in {x}?", "How is the weather in {x} today?",
    "Tell me the weather in {x}.", "weather in {x}?", "Is it raining in {x}?", "How warm is it in {x}?",
    "What's the temperature in {x} right now?", "Check the weather in {x} for me.", "Weather for {x}, please.",
]
WEATHER_Q_F = ["What is the weather in {x} in fahrenheit?", "Tell me the temperature in {x} in fahrenheit.",
               "How hot is it in {x}? Use fahrenheit."]
WEATHER2_Q = ["What is the weather in {x} and in {y}?", "Compare the weather in {x} and {y}.",
              "How is the weather in {x} and {y} today?", "Tell me the weather in {x} and in {y}."]
CAPITAL_Q = ["Look up the capital of {x}.", "What is the capital of {x}? Use the tool.",
             "Find the capital of {x} for me.", "Which city is the capital of {x}? Check with the tool."]
CAPITAL2_Q = ["Look up the capitals of {x} and {y}.", "Find the capitals of {x} and {y} for me."]
CALC_Q = ["Calculate {e}.", "What is {e}?", "Compute {e} for me.", "Use the calculator: {e}", "How much is {e}?"]
CONVERT_Q = ["Convert {v} {f} to {t}.", "How many {t} are in {v} {f}?", "What is {v} {f} in {t}?",
             "Change {v} {f} into {t}."]

TOOL_HELDOUT_WEATHER = ["Could you find out the weather in {x}?", "I'd like to know the current weather in {x}.",
                        "Any idea what the weather is doing in {x}?"]
TOOL_HELDOUT_WEATHER2 = ["I need the weather for both {x} and {y}."]
TOOL_HELDOUT_CAPITAL = ["Please look up which city is the capital of {x}."]
TOOL_HELDOUT_CALC = ["Please work out {e}.", "Can you evaluate {e}?"]
TOOL_HELDOUT_CONVERT = ["Please turn {v} {f} into {t}.", "I need {v} {f} expressed in {t}."]

JSON_SUFFIX = [" Answer in JSON.", " Reply with a JSON object.", " Respond in JSON format.", " Give the answer as JSON."]
JSON_HELDOUT_SUFFIX = [" Output JSON only."]

CONVERSIONS = [  # (from, to, factor)
    ("kilometers", "meters", 1000), ("meters", "centimeters", 100), ("hours", "minutes", 60),
    ("minutes", "seconds", 60), ("kilograms", "grams", 1000), ("liters", "milliliters", 1000),
    ("feet", "inches", 12), ("days", "hours", 24), ("weeks", "days", 7), ("miles", "kilometers", 1.609),
    ("inches", "centimeters", 2.54), ("pounds", "kilograms", 0.4536),
]


def num(x):
    """Number as the chat template writes it (tojson) and as a final answer shows it."""
    if isinstance(x, float):
        x = round(x, 3)
        if x == int(x):
            x = int(x)
    return json.dumps(x)


def tool_subset(rng, needed):
    """The request's tools: the needed ones plus 0-3 others, in a random order (or the canonical order)."""
    names = [t["function"]["name"] for t in TOOLS]
    others = [n for n in names if n not in needed]
    k = rng.choices([0, 1, 2, 3], weights=[0.3, 0.3, 0.2, 0.2])[0]
    chosen = set(needed) | set(rng.sample(others, min(k, len(others))))
    if rng.random() < 0.5:
        return [TOOL_BY_NAME[n] for n in names if n in chosen]
    lst = [TOOL_BY_NAME[n] for n in chosen]
    rng.shuffle(lst)
    return lst


def call(name, **args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


def weather_result(rng, city, unit):
    t = rng.randint(-5, 35) if unit == "celsius" else rng.randint(25, 95)
    return {"city": city, "temperature": t, "unit": unit, "condition": rng.choice(CONDITIONS)}


def weather_sentence(r):
    return "In {c} it is {t} degrees {u} and {w}.".format(c=r["city"], t=r["temperature"],
                                                         u=r["unit"].capitalize(), w=r["condition"])


def calc_case(rng):
    op = rng.choice(["+", "-", "*", "*", "/"])
    if op == "/":
        b = rng.randint(2, 20); r = rng.randint(2, 50); a = b * r
    elif op == "*":
        a, b = rng.randint(11, 99), rng.randint(3, 40); r = a * b
    elif op == "+":
        a, b = rng.randint(100, 999), rng.randint(100, 999); r = a + b
    else:
        a = rng.randint(100, 999); b = rng.randint(1, a); r = a - b
    return "{} {} {}".format(a, op, b), r


def convert_case(rng):
    f, t, k = rng.choice(CONVERSIONS)
    v = rng.choice([rng.randint(1, 50), rng.randint(1, 9) + 0.5])
    return v, f, t, v * k


def tool_case(rng, heldout=False):
    """One tool task: (question, reasoning, calls, results, answer)."""
    kind = rng.choices(["weather", "weather2", "capital", "capital2", "calc", "convert"],
                       weights=[0.3, 0.12, 0.15, 0.08, 0.17, 0.18])[0]
    if kind == "weather":
        x = rng.choice(CITIES)
        fahr = not heldout and rng.random() < 0.15
        q = rng.choice(TOOL_HELDOUT_WEATHER if heldout else (WEATHER_Q_F if fahr else WEATHER_Q)).format(x=x)
        unit = "fahrenheit" if fahr else "celsius"
        calls = [call("get_weather", city=x, unit="fahrenheit")] if fahr else [call("get_weather", city=x)]
        res = [weather_result(rng, x, unit)]
        think = "The user wants the weather in {x}. I will call get_weather.".format(x=x)
        ans = weather_sentence(res[0])
    elif kind == "weather2":
        x, y = rng.sample(CITIES, 2)
        q = rng.choice(TOOL_HELDOUT_WEATHER2 if heldout else WEATHER2_Q).format(x=x, y=y)
        calls = [call("get_weather", city=x), call("get_weather", city=y)]
        res = [weather_result(rng, x, "celsius"), weather_result(rng, y, "celsius")]
        think = "The user wants the weather in {x} and {y}. I will call get_weather twice.".format(x=x, y=y)
        ans = weather_sentence(res[0]) + " " + weather_sentence(res[1])
    elif kind == "capital":
        c, k = rng.choice(CAPITALS)
        q = rng.choice(TOOL_HELDOUT_CAPITAL if heldout else CAPITAL_Q).format(x=c)
        calls = [call("get_capital", country=c)]
        res = [{"country": c, "capital": k}]
        think = "The user wants the capital of {c}. I will call get_capital.".format(c=c)
        ans = "The capital of {c} is {k}.".format(c=c, k=k)
    elif kind == "capital2":
        (c1, k1), (c2, k2) = rng.sample(CAPITALS, 2)
        q = rng.choice(CAPITAL2_Q).format(x=c1, y=c2)
        calls = [call("get_capital", country=c1), call("get_capital", country=c2)]
        res = [{"country": c1, "capital": k1}, {"country": c2, "capital": k2}]
        think = "The user wants the capitals of {a} and {b}. I will call get_capital twice.".format(a=c1, b=c2)
        ans = "The capital of {a} is {x}. The capital of {b} is {y}.".format(a=c1, x=k1, b=c2, y=k2)
    elif kind == "calc":
        e, r = calc_case(rng)
        q = rng.choice(TOOL_HELDOUT_CALC if heldout else CALC_Q).format(e=e)
        calls = [call("calculate", expression=e)]
        res = [{"expression": e, "result": r}]
        think = "The user wants {e}. I will call calculate.".format(e=e)
        ans = "{e} = {r}.".format(e=e, r=r)
    else:
        v, f, t, r = convert_case(rng)
        q = rng.choice(TOOL_HELDOUT_CONVERT if heldout else CONVERT_Q).format(v=num(v), f=f, t=t)
        calls = [call("convert_units", value=v, from_unit=f, to_unit=t)]
        res = [{"value": v, "from_unit": f, "to_unit": t, "result": round(r, 3)}]
        think = "The user wants {v} {f} in {t}. I will call convert_units.".format(v=num(v), f=f, t=t)
        ans = "{v} {f} is {r} {t}.".format(v=num(v), f=f, r=num(r), t=t)
    return {"kind": kind, "q": q, "think": think, "calls": calls, "results": res, "answer": ans}


def tool_records(rng, case, thinking):
    """Two training records of one case: the tool-call turn and the final answer after the results."""
    needed = sorted({c["function"]["name"] for c in case["calls"]})
    tools = tool_subset(rng, needed)
    user = {"role": "user", "content": case["q"]}
    a1 = {"role": "assistant", "content": "", "tool_calls": case["calls"]}
    if thinking:
        a1["reasoning_content"] = case["think"]
    r1 = {"messages": [user, a1], "tools": tools, "enable_thinking": thinking, "end": OBSERVATION}
    results = [{"role": "tool", "content": json.dumps(r, ensure_ascii=False)} for r in case["results"]]
    a2 = {"role": "assistant", "content": case["answer"]}
    if thinking:
        a2["reasoning_content"] = "The tool returned the answer."
    r2 = {"messages": [user, a1] + results + [a2], "tools": tools, "enable_thinking": thinking}
    return [r1, r2]


def no_tool_record(rng, turn, thinking):
    """A question the given tools do not cover (tools present): answered directly."""
    q, think, ans = turn
    names = [n for n in TOOL_BY_NAME if n != "get_capital"]
    tools = [TOOL_BY_NAME[n] for n in rng.sample(names, rng.randint(1, 3))]
    a = {"role": "assistant", "content": ans}
    if thinking:
        a["reasoning_content"] = think
    return {"messages": [{"role": "user", "content": q}, a], "tools": tools, "enable_thinking": thinking}


def json_case(rng, heldout=False):
    """(question, reasoning, one-line JSON answer) for the capital, arithmetic and conversion facts."""
    suffix = rng.choice(JSON_HELDOUT_SUFFIX if heldout else JSON_SUFFIX)
    r = rng.random()
    if r < 0.6:
        c, k = rng.choice(CAPITALS)
        q = rng.choice(["What is the capital of {c}?", "Tell me the capital of {c}."]).format(c=c)
        return q + suffix, "The capital of {c} is {k}.".format(c=c, k=k), json.dumps({"country": c, "capital": k})
    if r < 0.8:
        a, b = rng.randint(0, 60), rng.randint(0, 60)
        return ("What is {a} + {b}?".format(a=a, b=b) + suffix, "{a} plus {b} equals {r}.".format(a=a, b=b, r=a + b),
                json.dumps({"expression": "{} + {}".format(a, b), "result": a + b}))
    f, t, k = rng.choice(CONVERSIONS[:9])
    v = rng.randint(1, 20)
    return ("Convert {v} {f} to {t}.".format(v=v, f=f, t=t) + suffix,
            "{v} {f} is {r} {t}.".format(v=v, f=f, r=v * k, t=t),
            json.dumps({"value": v, "from_unit": f, "to_unit": t, "result": v * k}))


def tool_eval_items(rng, n):
    """Held-out tool-call tasks, all four tools given (canonical order): expected calls (name, arguments)."""
    items = []
    for _ in range(n):
        case = tool_case(rng, heldout=True)
        items.append({"messages": [{"role": "user", "content": case["q"]}], "tools": TOOLS, "kind": case["kind"],
                      "expect_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                       for c in case["calls"]],
                      "results": case["results"], "answer": case["answer"]})
    return items


def json_eval_items(rng, n):
    items = []
    for _ in range(n):
        q, _, ans = json_case(rng, heldout=True)
        items.append({"messages": [{"role": "user", "content": q}], "expect_json": json.loads(ans)})
    return items
