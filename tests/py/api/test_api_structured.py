"""Structured output and forced tool calls (issue 16) through `latent serve` on the bundled demo model, with the
official openai client: response_format json_schema / json_object, vLLM's guided_* and structured_outputs, GBNF,
tool_choice required / named / none (GLM syntax), streaming tool-call deltas, a weather round trip, 400 for every
unsupported or malformed schema, and unconstrained requests unchanged.

These tests use schemas and tools the demo model was not trained on, so its constrained answers are syntactically
valid but not meaningful: they check validity (json + jsonschema), that the grammar ends the choice (finish_reason
stop / tool_calls), and the protocol, not the content. String fields get a maxLength so that the model still
completes within max_tokens. The model's trained tool calls and JSON answers are tested in test_api_demo_tools.py."""
import json
import re

import pytest

from conftest import ROOT, Server, _skip_reason

DEMO = ROOT / "models" / "latent-demo"
Q = [{"role": "user", "content": "What is the capital of France?"}]

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24},
        "is_capital": {"type": "boolean"},
        "rank": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["big", "old", "coastal"]}, "maxItems": 3},
    },
    "required": ["city", "country", "is_capital", "rank", "tags"],
    "additionalProperties": False,
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "convert_units", "description": "Convert a value between units",
        "parameters": {"type": "object", "properties": {
            "value": {"type": "number"},
            "from_unit": {"type": "string", "maxLength": 12},
            "to_unit": {"type": "string", "maxLength": 12}},
            "required": ["value", "from_unit", "to_unit"]}}},
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    if not (DEMO / "model.safetensors").exists():
        pytest.skip(f"demo model not present at {DEMO}")
    s = Server(DEMO, [], tmp_path_factory.mktemp("logs") / "structured.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(demo):
    return demo.client()


def _validate(value, schema):
    import jsonschema
    jsonschema.validate(value, schema)


def _chat(client, **kw):
    kw.setdefault("model", "tiny-glm")
    kw.setdefault("messages", Q)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 300)
    return client.chat.completions.create(**kw)


# Under ASan (heavy deselected) one of the four combinations runs; release runs them all.
_HEAVY = pytest.mark.heavy
@pytest.mark.parametrize("strict,thinking", [(True, True), pytest.param(True, False, marks=_HEAVY),
                                             pytest.param(False, True, marks=_HEAVY),
                                             pytest.param(False, False, marks=_HEAVY)])
def test_json_schema_output_parses_and_validates(client, thinking, strict):
    r = _chat(client, response_format={"type": "json_schema",
                                       "json_schema": {"name": "city", "schema": CITY, "strict": strict}},
              extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
    ch = r.choices[0]
    assert ch.finish_reason == "stop", ch
    value = json.loads(ch.message.content)
    _validate(value, CITY)
    assert list(value) == list(CITY["properties"])
    reasoning = (ch.message.model_extra or {}).get("reasoning_content")
    # Reasoning stays unconstrained: free text before the JSON, which starts after </think>.
    assert bool(reasoning) == thinking
    if thinking:
        assert not reasoning.lstrip().startswith("{")


@pytest.mark.heavy  # slow under ASan (deselected there); release runs it
def test_vllm_guided_json_and_structured_outputs_json(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"},
                                               "kind": {"enum": ["a", "b", None]}},
              "required": ["ok", "n", "kind"]}
    for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)}, {"structured_outputs": {"json": schema}}):
        r = _chat(client, extra_body=extra)
        assert r.choices[0].finish_reason == "stop"
        _validate(json.loads(r.choices[0].message.content), schema)


@pytest.mark.heavy  # slow under ASan (deselected there); release runs it
def test_json_object_is_an_object(client):
    r = _chat(client, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.heavy
def test_json_schema_streaming_equals_non_streaming(client):
    rf = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    full = _chat(client, response_format=rf).choices[0].message.content
    text = "".join(c.choices[0].delta.content or "" for c in _chat(client, response_format=rf, stream=True) if c.choices)
    assert text == full


@pytest.mark.heavy
def test_json_schema_n2_each_choice_constrained(client):
    r = _chat(client, n=2, temperature=1.0, seed=5, response_format={
        "type": "json_schema", "json_schema": {"name": "city", "schema": CITY}})
    assert len(r.choices) == 2
    for ch in r.choices:
        if ch.finish_reason == "stop":
            _validate(json.loads(ch.message.content), CITY)
        else:  # sampled at temperature 1 the model may run out of tokens inside a number; still a valid prefix
            assert ch.finish_reason == "length" and ch.message.content.lstrip().startswith("{")


def test_guided_choice_and_regex(client):
    choices = ["Paris", "London", "Rome", "Madrid"]
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        r = _chat(client, extra_body=extra)
        assert r.choices[0].message.content in choices
        assert r.choices[0].finish_reason == "stop"
    pattern = r"[A-Z][a-z]{2,8} is (big|small)\."
    for extra in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
        r = _chat(client, extra_body=extra)
        assert re.fullmatch(pattern, r.choices[0].message.content), r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop"


def test_guided_grammar_gbnf(client):
    grammar = 'root ::= "The answer is " answer "."\nanswer ::= "yes" | "no" | [0-9]{1,3}\n'
    r = _chat(client, extra_body={"guided_grammar": grammar})
    assert re.fullmatch(r"The answer is (yes|no|[0-9]{1,3})\.", r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"


def test_completions_guided_regex(client):
    r = client.completions.create(model="tiny-glm", prompt="The capital of France is", max_tokens=30, temperature=0,
                                  extra_body={"guided_regex": r" [A-Z][a-z]{2,8}\."})
    assert re.fullmatch(r" [A-Z][a-z]{2,8}\.", r.choices[0].text), r.choices[0].text
    assert r.choices[0].finish_reason == "stop"


def _params(name):
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def _check_call(call):
    assert call.type == "function"
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id)
    args = json.loads(call.function.arguments)
    _validate(args, _params(call.function.name))
    return args


W = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.mark.heavy
def test_tool_choice_required(client):
    r = _chat(client, messages=W, tools=TOOLS, tool_choice="required")
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.tool_calls
    for call in ch.message.tool_calls:
        assert call.function.name in ("get_weather", "convert_units")
        _check_call(call)


@pytest.mark.heavy  # slow under ASan (deselected there); release runs it
def test_tool_choice_named(client):
    for name in ("get_weather", "convert_units"):
        r = _chat(client, messages=W, tools=TOOLS, tool_choice={"type": "function", "function": {"name": name}})
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls"
        assert [c.function.name for c in ch.message.tool_calls] == [name]
        _check_call(ch.message.tool_calls[0])


def test_tool_choice_required_without_parallel_calls_is_one_call(client):
    r = _chat(client, messages=W, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    assert len(r.choices[0].message.tool_calls) == 1


def test_tool_choice_none_never_calls(client):
    r = _chat(client, messages=W, tools=TOOLS, tool_choice="none", max_tokens=60)
    assert not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.content


def test_tool_choice_auto_parses_as_before(client):
    r = _chat(client, messages=W, tools=TOOLS, tool_choice="auto", max_tokens=60)
    ch = r.choices[0]
    if ch.message.tool_calls:  # the demo model does not call tools by itself; if it does, calls are parsed
        assert ch.finish_reason == "tool_calls"
    else:
        assert ch.finish_reason in ("stop", "length")


def test_streaming_tool_call_deltas(client):
    full = _chat(client, messages=W, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = {}
    finish = None
    for chunk in _chat(client, messages=W, tools=TOOLS, stream=True,
                       tool_choice={"type": "function", "function": {"name": "get_weather"}}):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        for d in c.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                assert slot["id"] is None
                slot["id"] = d.id
                assert d.type == "function"
            if d.function and d.function.name:
                slot["name"] = d.function.name
            if d.function and d.function.arguments:
                slot["arguments"] += d.function.arguments
        if c.finish_reason:
            finish = c.finish_reason
    assert finish == "tool_calls"
    assert sorted(calls) == list(range(len(calls))) and len(calls) == 1
    got = calls[0]
    assert got["name"] == "get_weather" and re.fullmatch(r"call_[A-Za-z0-9]{24}", got["id"])
    _validate(json.loads(got["arguments"]), _params("get_weather"))
    want = full.choices[0].message.tool_calls[0]
    assert (got["name"], json.loads(got["arguments"])) == (want.function.name, json.loads(want.function.arguments))


@pytest.mark.heavy
def test_weather_round_trip(client):
    """call (forced) -> tool result -> final answer."""
    r = _chat(client, messages=W, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = r.choices[0].message.tool_calls[0]
    args = _check_call(call)
    result = {"city": args["city"], "temperature": 18, "unit": args["unit"], "conditions": "sunny"}
    history = W + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
    ]
    final = _chat(client, messages=history, tools=TOOLS, max_tokens=80)
    ch = final.choices[0]
    assert ch.finish_reason in ("stop", "length", "tool_calls")
    assert ch.message.content or ch.message.tool_calls
    # The same turn with the answer forced into a schema: the round trip ends in a valid JSON answer.
    answer = {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 40},
                                               "temperature": {"type": "integer"}},
              "required": ["summary", "temperature"], "additionalProperties": False}
    final = _chat(client, messages=history, tools=TOOLS, tool_choice="none",
                  response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": answer}})
    assert final.choices[0].finish_reason == "stop"
    _validate(json.loads(final.choices[0].message.content), answer)


UNSUPPORTED = [
    ({"type": "integer", "minimum": 0}, "minimum"),
    ({"type": "string", "format": "date-time"}, "format"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "patternProperties": {"^a": {"type": "string"}}}, "patternProperties"),
    ({"not": {"type": "string"}}, "not"),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "allOf"),
    ({"type": "array", "prefixItems": [{"type": "string"}]}, "prefixItems"),
    ({"type": "array", "items": [{"type": "string"}]}, "items"),
    ({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}}, "multipleOf"),
    ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "if"),
]

MALFORMED = [
    {"type": "strin"},
    {"type": "object", "required": "a"},
    {"type": "object", "properties": [1]},
    {"enum": []},
    {"$ref": "#/$defs/missing"},
    {"type": "string", "minLength": -1},
    {"type": "string", "pattern": "(a"},
    {"anyOf": {}},
    {"type": "array", "minItems": 3, "maxItems": 1},
    False,
]


def _error(exc):
    body = exc.body if isinstance(exc.body, dict) else {}
    return body.get("error", body)


@pytest.mark.parametrize("schema,keyword", UNSUPPORTED, ids=[k for _, k in UNSUPPORTED])
def test_unsupported_schema_is_400_naming_the_keyword(client, schema, keyword):
    import openai
    for kw in ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
               {"extra_body": {"guided_json": schema}}):
        with pytest.raises(openai.BadRequestError) as e:
            _chat(client, **kw)
        err = _error(e.value)
        assert e.value.status_code == 400
        assert err["code"] == "unsupported_parameter"
        assert f"'{keyword}'" in err["message"]
        assert err["param"] in ("response_format.json_schema.schema", "guided_json")


@pytest.mark.parametrize("schema", MALFORMED, ids=[json.dumps(s) for s in MALFORMED])
def test_malformed_schema_is_400(client, schema):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, extra_body={"guided_json": schema})
    err = _error(e.value)
    assert e.value.status_code == 400 and err["code"] == "invalid_value" and err["param"] == "guided_json"
    assert "schema" in err["message"].lower() or "no value" in err["message"]


@pytest.mark.parametrize("extra,param", [
    ({"guided_regex": "(a"}, "guided_regex"),
    ({"guided_regex": "a(?=b)"}, "guided_regex"),
    ({"guided_grammar": "root ::= root \"a\" | \"b\""}, "guided_grammar"),
    ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar"),
    ({"guided_grammar": "start ::= \"a\""}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
])
def test_malformed_regex_grammar_choice_is_400(client, extra, param):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, extra_body=extra)
    assert _error(e.value)["param"] == param


def test_tool_schema_errors_are_400(client):
    import openai
    bad_tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "maximum": 3}}}}}]
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, messages=W, tools=bad_tools, tool_choice="required")
    err = _error(e.value)
    assert err["code"] == "unsupported_parameter" and err["param"] == "tools" and "'maximum'" in err["message"]
    # tool_choice auto does not compile the schema: the request works as before.
    r = _chat(client, messages=W, tools=bad_tools, max_tokens=10)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("tool_choice", [None, "auto", "none", "required", "named"])
@pytest.mark.parametrize("params,needle", [
    ({"type": "objekt", "properties": 5}, "'objekt' is not a JSON Schema type"),
    ({"type": "object", "properties": {"city": {"type": "string", "minLength": -1}}},
     "at #/properties/city: 'minLength' must be a non-negative integer"),
    ({"type": "object", "required": "city"}, "'required' must be an array of strings"),
])
def test_malformed_tool_schema_is_400_whatever_tool_choice(client, tool_choice, params, needle):
    """Every tool's `parameters` is validated whenever `tools` is given (as the OpenAI API does), not only when a
    call is forced: 400 invalid_value naming the tool and the schema error."""
    import openai
    tools = TOOLS + [{"type": "function", "function": {"name": "bad_tool", "parameters": params}}]
    named = {"type": "function", "function": {"name": "bad_tool"}}
    kw = {} if tool_choice is None else {"tool_choice": named if tool_choice == "named" else tool_choice}
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, messages=W, tools=tools, max_tokens=5, **kw)
    err = _error(e.value)
    assert err["code"] == "invalid_value", err
    assert err["param"] == f"tools[{len(TOOLS)}].function.parameters", err
    assert "Invalid schema for function 'bad_tool'" in err["message"] and needle in err["message"], err


def test_unconstrained_requests_unchanged(demo, client):
    """No constraint, response_format text, and an empty structured_outputs all give the golden greedy answer."""
    fx = json.loads((ROOT / "tests" / "golden" / "latent-demo" / "greedy.json").read_text())
    it = fx["items"][0]
    kwargs = {"chat_template_kwargs": {"enable_thinking": it["enable_thinking"]}}
    outs = []
    for extra in ({}, {"response_format": {"type": "text"}}, {"structured_outputs": {}}):
        st, r = demo.json("POST", "/v1/chat/completions", {
            "model": "tiny-glm", "messages": it["messages"], "temperature": 0, "max_tokens": fx["max_new_tokens"],
            **kwargs, **extra})
        assert st == 200, r
        outs.append(r["choices"][0]["message"].get("content") or "")
    assert outs[0] == it["content"]
    assert outs == [outs[0]] * 3
