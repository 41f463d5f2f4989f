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
JSON_SUFFIX_MORE = JSON_SUFFIX + [" Reply in JSON.", " JSON please.", " Format the answer as JSON.",
                                  " Return a JSON object.", " Please answer with JSON.", " I want the answer in JSON.",
                                  " Use JSON for the answer."]
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


def json_case(rng, heldout=False, more_suffixes=False):
    """(question, reasoning, one-line JSON answer) for the capital, arithmetic and conversion facts."""
    suffix = rng.choice(JSON_HELDOUT_SUFFIX if heldout else JSON_SUFFIX_MORE if more_suffixes else JSON_SUFFIX)
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


# ---- Training tasks with argument values drawn from open pools (train_tool_case): the model must copy the city,
# country, expression or quantity from the question, since no value recurs often enough to be memorised. The
# phrasings are TRAIN_* (none of TOOL_HELDOUT_*); tool_case() above is kept unchanged for the held-out evaluation.

EXTRA_CITIES = [
    "San Francisco", "Houston", "Miami", "Denver", "Atlanta", "Dallas", "Phoenix", "Philadelphia", "Detroit",
    "Montreal", "Calgary", "Quebec City", "Guadalajara", "Monterrey", "Sao Paulo", "Salvador", "Cordoba", "Medellin",
    "Cusco", "Valparaiso", "Manchester", "Liverpool", "Glasgow", "Edinburgh", "Birmingham", "Cork", "Antwerp",
    "Rotterdam", "Utrecht", "Cologne", "Frankfurt", "Stuttgart", "Dresden", "Leipzig", "Salzburg", "Graz", "Basel",
    "Lausanne", "Turin", "Naples", "Venice", "Bologna", "Palermo", "Seville", "Valencia", "Bilbao", "Malaga",
    "Nice", "Toulouse", "Bordeaux", "Strasbourg", "Gothenburg", "Malmo", "Bergen", "Aarhus", "Tampere", "Gdansk",
    "Wroclaw", "Brno", "Debrecen", "Cluj-Napoca", "Thessaloniki", "Izmir", "Antalya", "Odesa", "Kharkiv",
    "Saint Petersburg", "Novosibirsk", "Almaty", "Samarkand", "Tabriz", "Isfahan", "Basra", "Aleppo", "Haifa",
    "Alexandria", "Casablanca", "Marrakesh", "Lagos", "Kano", "Mombasa", "Durban", "Johannesburg", "Zanzibar",
    "Karachi", "Lahore", "Chennai", "Kolkata", "Bangalore", "Hyderabad", "Chittagong", "Mandalay", "Chiang Mai",
    "Ho Chi Minh City", "Da Nang", "Cebu", "Surabaya", "Bandung", "Penang", "Busan", "Incheon", "Sapporo",
    "Nagoya", "Fukuoka", "Hong Kong", "Guangzhou", "Shenzhen", "Chengdu", "Wuhan", "Xi'an", "Harbin", "Perth",
    "Brisbane", "Adelaide", "Hobart", "Christchurch", "Honolulu", "Anchorage", "Reno", "Tucson", "Portland"]
_SYL = ["ba", "vel", "mor", "ka", "ri", "ton", "lan", "sa", "dor", "ne", "qui", "zo", "har", "len", "mi", "ost",
        "ur", "fa", "gen", "tra", "bel", "no", "cas", "pi", "ro", "wen", "ju", "del", "ta", "ix", "um", "sel", "var",
        "eo", "lu", "bra", "sk", "an", "ves", "hol", "dra", "ki", "mon", "pa", "ly", "zan", "tor", "ea", "fin", "go"]
_PLACE_PRE = ["", "", "", "", "Port ", "San ", "New ", "Saint ", "Fort ", "Lake ", "North ", "East ", "Santa ",
              "Mount ", "Upper "]
_PLACE_SUF = ["", "", "", "", "", " City", "ville", "burg", "ton", "stad", "ia", "holm", " Bay", " Springs"]


def synth_name(rng, parts=(2, 3)):
    """A made-up place name such as 'Port Velmora' or 'Kastonburg' (tokenizes into several BPE pieces)."""
    w = "".join(rng.choice(_SYL) for _ in range(rng.randint(*parts)))
    return (rng.choice(_PLACE_PRE) + w.capitalize() + rng.choice(_PLACE_SUF)).strip()


REAL_VALUES_ONLY = [False]  # make_corpus --real-values: no made-up places


def train_city(rng):
    r = rng.random() * (0.6 if REAL_VALUES_ONLY[0] else 1.0)
    if r < 0.35:
        return rng.choice(CITIES)
    if r < 0.6:
        return rng.choice(EXTRA_CITIES)
    return synth_name(rng)


def train_country(rng):
    """(country, capital): a real one (its true capital) or a made-up one with a made-up capital."""
    if REAL_VALUES_ONLY[0] or rng.random() < 0.5:
        return rng.choice(CAPITALS)
    c = synth_name(rng)
    if rng.random() < 0.25:
        c = rng.choice(["the Republic of ", "the Kingdom of ", "the ", "North ", "South "]) + c
    return c, synth_name(rng)


def train_number(rng):
    r = rng.random()
    if r < 0.3:
        return rng.randint(0, 99)
    if r < 0.65:
        return rng.randint(100, 999)
    if r < 0.9:
        return rng.randint(1000, 99999)
    return rng.randint(2, 20)


def train_expression(rng):
    """An expression string and its value: a op b (most), a op b op c, or (a op b) op c; integer results."""
    def pair():
        op = rng.choice(["+", "-", "*", "/"])
        if op == "/":
            b = rng.choice([rng.randint(2, 20), rng.randint(2, 99)]); r = rng.randint(1, 999); return b * r, op, b
        if op == "*":
            return train_number(rng) % 1000, op, rng.choice([rng.randint(2, 99), train_number(rng) % 1000])
        return train_number(rng), op, train_number(rng)
    a, op, b = pair()
    e = "{} {} {}".format(a, op, b)
    v = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a // b
    k = rng.random()
    if k < 0.12:
        c = rng.randint(1, 99)
        op2 = rng.choice(["+", "-"])
        e = ("({}) {} {}" if rng.random() < 0.5 else "{} {} {}").format(e, op2, c)
        v = v + c if op2 == "+" else v - c
    return e, v


TRAIN_UNITS = CONVERSIONS + [
    ("meters", "feet", 3.281), ("grams", "ounces", 0.03527), ("liters", "gallons", 0.2642), ("yards", "meters", 0.9144),
    ("kilometers", "miles", 0.6214), ("ounces", "grams", 28.35), ("gallons", "liters", 3.785), ("cups", "milliliters", 240),
    ("hectares", "acres", 2.471), ("acres", "square meters", 4047), ("tons", "kilograms", 1000), ("years", "days", 365),
    ("seconds", "milliseconds", 1000), ("megabytes", "kilobytes", 1024), ("gigabytes", "megabytes", 1024),
    ("centimeters", "millimeters", 10), ("meters", "kilometers", 0.001), ("grams", "kilograms", 0.001),
    ("minutes", "hours", 0.01667), ("milliliters", "liters", 0.001), ("inches", "feet", 0.08333),
    ("kilograms", "pounds", 2.205), ("nautical miles", "kilometers", 1.852), ("feet", "meters", 0.3048)]


def train_quantity(rng):
    r = rng.random()
    if r < 0.5:
        return rng.randint(1, 100)
    if r < 0.7:
        return rng.randint(100, 5000)
    if r < 0.9:
        return rng.randint(1, 99) + rng.choice([0.5, 0.25, 0.75, 0.2, 0.1])
    return round(rng.uniform(0.1, 500), rng.choice([1, 2]))


TRAIN_WEATHER_Q = WEATHER_Q + [
    "What's it like outside in {x}?", "Can you check the weather in {x}?", "Get me the current weather for {x}.",
    "How is it outside in {x} at the moment?", "Show me the weather in {x}.", "Look up the weather in {x}.",
    "Do I need an umbrella in {x} today?", "What are the weather conditions in {x}?", "Is it cold in {x}?",
    "I am travelling to {x}. What is the weather there?", "Current conditions in {x}?", "{x} weather?",
    "Find the weather for {x}.", "How's the weather over in {x}?", "What temperature is it in {x}?",
    "Please check the weather in {x}.", "Would you look up the weather in {x}?", "Is it sunny in {x} now?",
    "Give me the weather report for {x}.", "The weather in {x}, please.", "Tell me how the weather is in {x}."]
TRAIN_WEATHER_Q_F = WEATHER_Q_F + [
    "What is the temperature in {x} in fahrenheit?", "Weather in {x}, in fahrenheit please.",
    "Check the weather in {x} and give me fahrenheit.", "How warm is it in {x} in degrees fahrenheit?"]
TRAIN_WEATHER2_Q = WEATHER2_Q + [
    "What's the weather like in {x} and {y}?", "Check the weather in {x} and in {y}.", "Weather in {x} and {y}?",
    "Tell me how the weather is in {x} and in {y}.", "Look up the weather for {x} and for {y}.",
    "I am flying from {x} to {y}. What is the weather in both cities?", "How warm is it in {x} and in {y}?",
    "Get me the weather in {x} as well as in {y}.", "Is it raining in {x} or in {y}?"]
TRAIN_CAPITAL_Q = CAPITAL_Q + [
    "Use the tool to find the capital of {x}.", "Get the capital of {x}.", "Check the capital of {x} with the tool.",
    "What's the capital city of {x}? Look it up.", "Tell me the capital of {x} using get_capital.",
    "Which city is the capital of {x}? Look it up for me.", "I need the capital of {x}; use the lookup tool.",
    "Can you look up the capital of {x}?", "Search for the capital of {x}."]
TRAIN_CAPITAL2_Q = CAPITAL2_Q + [
    "What are the capitals of {x} and {y}? Use the tool.", "Get the capitals of {x} and of {y}.",
    "Check the capitals of {x} and {y} with the tool.", "Look up the capital of {x} and the capital of {y}."]
TRAIN_CALC_Q = CALC_Q + [
    "What does {e} equal?", "Work this out: {e}", "Solve {e}.", "Calculate {e} for me, please.", "{e} = ?",
    "What is the result of {e}?", "Can you calculate {e}?", "Find the value of {e}.", "Evaluate this: {e}",
    "I need the result of {e}.", "Quick math: {e}", "How much do you get for {e}?", "Do the math: {e}."]
TRAIN_CONVERT_Q = CONVERT_Q + [
    "Convert {v} {f} into {t}, please.", "{v} {f} is how many {t}?", "How much is {v} {f} in {t}?",
    "Can you convert {v} {f} to {t}?", "I have {v} {f}. How many {t} is that?", "Express {v} {f} in {t}.",
    "What do {v} {f} come to in {t}?", "Give me {v} {f} in {t}.", "Please convert {v} {f} to {t}.",
    "{v} {f} to {t}?", "How many {t} is {v} {f}?", "Turn {v} {f} to {t} for me."]
TRAIN_PREFIX = ["", "", "", "", "", "", "Hi! ", "Hello. ", "Hey, ", "Quick question. ", "One more thing. ",
                "I have a question. ", "Thanks for your help earlier. ", "Good morning! "]
TRAIN_SUFFIX = ["", "", "", "", "", "", " Thanks!", " Thank you.", " Please be quick.", " Use the tools."]
TRAIN_CONDITIONS = CONDITIONS + ["partly cloudy", "overcast", "humid", "drizzly", "hot", "cold", "hazy"]


def _wrap(rng, q):
    p = rng.choice(TRAIN_PREFIX)
    if p.endswith(", ") and q[0].isupper() and not q.startswith("I ") and rng.random() < 0.5:
        q = q[0].lower() + q[1:]
    return p + q + rng.choice(TRAIN_SUFFIX)


def train_weather_result(rng, city, unit):
    t = rng.randint(-30, 45) if unit == "celsius" else rng.randint(-10, 110)
    return {"city": city, "temperature": t, "unit": unit, "condition": rng.choice(TRAIN_CONDITIONS)}


def train_tool_case(rng):
    """One training tool task with open-pool values: (kind, question, reasoning, calls, results, answer)."""
    kind = rng.choices(["weather", "weather2", "capital", "capital2", "calc", "convert"],
                       weights=[0.22, 0.16, 0.13, 0.09, 0.22, 0.18])[0]
    if kind == "weather":
        x = train_city(rng)
        fahr = rng.random() < 0.15
        q = rng.choice(TRAIN_WEATHER_Q_F if fahr else TRAIN_WEATHER_Q).format(x=x)
        unit = "fahrenheit" if fahr else "celsius"
        calls = [call("get_weather", city=x, unit="fahrenheit")] if fahr else [call("get_weather", city=x)]
        res = [train_weather_result(rng, x, unit)]
        think = "The user wants the weather in {x}. I will call get_weather.".format(x=x)
        ans = weather_sentence(res[0])
    elif kind == "weather2":
        x, y = train_city(rng), train_city(rng)
        while y == x:
            y = train_city(rng)
        q = rng.choice(TRAIN_WEATHER2_Q).format(x=x, y=y)
        calls = [call("get_weather", city=x), call("get_weather", city=y)]
        res = [train_weather_result(rng, x, "celsius"), train_weather_result(rng, y, "celsius")]
        think = "The user wants the weather in {x} and {y}. I will call get_weather twice.".format(x=x, y=y)
        ans = weather_sentence(res[0]) + " " + weather_sentence(res[1])
    elif kind == "capital":
        c, k = train_country(rng)
        q = rng.choice(TRAIN_CAPITAL_Q).format(x=c)
        calls = [call("get_capital", country=c)]
        res = [{"country": c, "capital": k}]
        think = "The user wants the capital of {c}. I will call get_capital.".format(c=c)
        ans = "The capital of {c} is {k}.".format(c=c, k=k)
    elif kind == "capital2":
        (c1, k1), (c2, k2) = train_country(rng), train_country(rng)
        while c2 == c1:
            c2, k2 = train_country(rng)
        q = rng.choice(TRAIN_CAPITAL2_Q).format(x=c1, y=c2)
        calls = [call("get_capital", country=c1), call("get_capital", country=c2)]
        res = [{"country": c1, "capital": k1}, {"country": c2, "capital": k2}]
        think = "The user wants the capitals of {a} and {b}. I will call get_capital twice.".format(a=c1, b=c2)
        ans = "The capital of {a} is {x}. The capital of {b} is {y}.".format(a=c1, x=k1, b=c2, y=k2)
    elif kind == "calc":
        e, r = train_expression(rng)
        q = rng.choice(TRAIN_CALC_Q).format(e=e)
        calls = [call("calculate", expression=e)]
        res = [{"expression": e, "result": r}]
        think = "The user wants {e}. I will call calculate.".format(e=e)
        ans = "{e} = {r}.".format(e=e, r=r)
    else:
        f, t, k = rng.choice(TRAIN_UNITS)
        v = train_quantity(rng)
        r = v * k
        q = rng.choice(TRAIN_CONVERT_Q).format(v=num(v), f=f, t=t)
        calls = [call("convert_units", value=v, from_unit=f, to_unit=t)]
        res = [{"value": v, "from_unit": f, "to_unit": t, "result": round(r, 3)}]
        think = "The user wants {v} {f} in {t}. I will call convert_units.".format(v=num(v), f=f, t=t)
        ans = "{v} {f} is {r} {t}.".format(v=num(v), f=f, r=num(r), t=t)
    return {"kind": kind, "q": _wrap(rng, q), "think": think, "calls": calls, "results": res, "answer": ans}


OTHER_TOOLS_WEIGHTS = [0.15, 0.15, 0.2, 0.5]  # P(0..3 tools besides the needed ones); make_corpus --other-tools


def train_tool_subset(rng, needed):
    """As tool_subset, with all four tools more often by default (the evaluation gives all four)."""
    names = [t["function"]["name"] for t in TOOLS]
    others = [n for n in names if n not in needed]
    k = rng.choices([0, 1, 2, 3], weights=OTHER_TOOLS_WEIGHTS)[0]
    chosen = set(needed) | set(rng.sample(others, min(k, len(others))))
    lst = [TOOL_BY_NAME[n] for n in names if n in chosen]
    if rng.random() >= 0.6:
        rng.shuffle(lst)  # from the canonical order: unlike a set's order, the same on every run
    return lst


def tool_record_merged(rng, case, thinking):
    """One training record holding both turns of a case: the call turn (trained up to `<|observation|>`), the
    `<tool_response>` results (not trained) and the final answer. "train" lists the trained assistant messages
    (index, end token); common.encode_record turns them into loss spans. Same tokens as tool_records' two records,
    at half the cost: the long tool prompt is processed once."""
    needed = sorted({c["function"]["name"] for c in case["calls"]})
    tools = train_tool_subset(rng, needed)
    user = {"role": "user", "content": case["q"]}
    a1 = {"role": "assistant", "content": "", "tool_calls": case["calls"]}
    if thinking:
        a1["reasoning_content"] = case["think"]
    results = [{"role": "tool", "content": json.dumps(r, ensure_ascii=False)} for r in case["results"]]
    a2 = {"role": "assistant", "content": case["answer"]}
    if thinking:
        a2["reasoning_content"] = "The tool returned the answer."
    msgs = [user, a1] + results + [a2]
    return {"messages": msgs, "tools": tools, "enable_thinking": thinking,
            "train": [[1, OBSERVATION], [len(msgs) - 1, "<|user|>"]]}
