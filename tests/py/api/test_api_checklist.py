"""The docs/api.md §checklist conformance checks, black-box, with the official openai client against `latent serve`."""
import json
import re

import openai
import pytest

USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "example", "description": "d", "parameters": {
    "type": "object", "properties": {"latent": {"type": "string"}}}}}]


def assert_error(st, body, status, code, param="__any__"):
    assert st == status, body
    assert set(body.keys()) == {"error"}, body
    e = body["error"]
    assert set(e.keys()) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"]
    assert e["code"] is None or isinstance(e["code"], str)
    assert e["code"] == code, e
    if param != "__any__":
        assert e["param"] == param, e


def no_tool(server):
    """logit_bias that bans <tool_call>, so the planted model answers with content."""
    st, t = server.json("POST", "/tokenize", {"prompt": "<tool_call>"})
    assert st == 200 and t["count"] == 1
    return {str(t["tokens"][0]): -100}


def collect_stream(stream):
    chunks = list(stream)
    content, reasoning, calls, finish = "", "", {}, {}
    for c in chunks:
        for ch in c.choices:
            d = ch.delta
            content += d.content or ""
            r = getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content")
            reasoning += r or ""
            for tc in d.tool_calls or []:
                e = calls.setdefault(tc.index, {"name": None, "arguments": ""})
                if tc.function and tc.function.name is not None:
                    assert e["name"] is None, "name sent twice"
                    e["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    e["arguments"] += tc.function.arguments
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    return chunks, content, reasoning, calls, finish


# 1 + 2: error envelope and every row of the docs/api.md §errors table we can reproduce from outside
# -------------------------------

def test_error_table(server):
    assert_error(*server.json("POST", "/v1/chat/completions", "{nope"), 400, "invalid_json", None)
    assert_error(*server.json("POST", "/v1/chat/completions", {}), 400, "missing_required_parameter", "messages")
    assert_error(*server.json("POST", "/v1/chat/completions", {"messages": USER, "n": "2"}), 400, "invalid_type", "n")
    assert_error(*server.json("POST", "/v1/chat/completions", {"messages": USER, "temperature": 3}), 400, "invalid_value",
                 "temperature")
    assert_error(*server.json("POST", "/v1/chat/completions", {"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "d", "schema": {"type": "string", "format": "date"}}}}),
                 400, "unsupported_parameter", "response_format.json_schema.schema")
    assert_error(*server.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 1100}]}),
                 400, "context_length_exceeded", "messages")
    assert_error(*server.json("POST", "/v1/chat/completions", {"messages": USER, "model": "nope"}), 404,
                 "model_not_found", "model")
    assert_error(*server.json("GET", "/v1/nothing"), 404, "not_found")
    assert_error(*server.json("POST", "/v1/responses", {}), 404, "not_found")
    assert_error(*server.json("GET", "/v1/models/nope"), 404, "not_found", "id")
    st, h, b = server.request("GET", "/v1/chat/completions")
    assert_error(st, json.loads(b), 405, "method_not_allowed")
    assert h["allow"] == "POST"


def test_auth_and_order(auth_server):
    s = auth_server
    st, h, b = s.request("POST", "/v1/chat/completions", "{bad json")  # wrong key + bad JSON -> 401 first
    assert_error(st, json.loads(b), 401, "invalid_api_key", None)
    assert h["www-authenticate"] == "Bearer"
    assert_error(*s.json("POST", "/v1/chat/completions", "x" * 10000), 401, "invalid_api_key")  # before size
    assert_error(*s.json("POST", "/v1/chat/completions", "x" * 10000, {"Authorization": "Bearer sk-test-1"}), 413,
                 "request_too_large")
    assert_error(*s.json("POST", "/tokenize", {"prompt": "a"}, {"Authorization": "Bearer wrong"}), 401, "invalid_api_key")
    assert s.json("GET", "/health")[0] == 200
    assert s.json("GET", "/version")[0] == 200
    st, _, _ = s.request("GET", "/metrics")
    assert st == 200
    with pytest.raises(openai.AuthenticationError):
        s.client("sk-wrong").models.list()
    models = s.client("sk-test-2").models.list()
    assert [m.id for m in models.data] == ["tiny-glm", "tiny-alias"]
    st, _ = s.json("GET", "/v1/models", None, {"x-api-key": "sk-test-1"})
    assert st == 200


# 3-6 ---------------------------------------------------------------------------------------------------------------

def test_cross_field_rules(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-glm", messages=USER, top_logprobs=5)
    assert e.value.body["param"] == "top_logprobs" and e.value.body["code"] == "invalid_value"
    assert_error(*server.json("POST", "/v1/chat/completions", {"messages": USER, "stream": False,
                                                               "stream_options": {"include_usage": True}}),
                 400, "invalid_value", "stream_options")
    assert_error(*server.json("POST", "/v1/chat/completions", {"messages": USER, "tools": []}), 400, "invalid_value", "tools")
    assert_error(*server.json("POST", "/v1/chat/completions", {"messages": USER, "tool_choice": "auto"}), 400,
                 "invalid_value", "tool_choice")
    assert_error(*server.json("POST", "/v1/chat/completions", {
        "messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}}),
        400, "invalid_value", "tool_choice.function.name")
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=USER)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


# 7: context length ---------------------------------------------------------------------------------------------------

def test_context_length(server, clamp_server, tiny_model):
    C = tiny_model["max_pos"]
    st, b = server.json("POST", "/v1/chat/completions", {"messages": USER, "max_completion_tokens": C})
    assert_error(st, b, 400, "context_length_exceeded", "max_completion_tokens")
    assert re.search(rf"maximum context length is {C} tokens\. However, you requested \d+ tokens", b["error"]["message"])
    st, b = server.json("POST", "/v1/chat/completions", {"messages": USER, "max_tokens": C})
    assert_error(st, b, 400, "context_length_exceeded", "max_tokens")
    st, b = server.json("POST", "/v1/completions", {"prompt": "Please", "max_tokens": C})
    assert_error(st, b, 400, "context_length_exceeded", "max_tokens")
    st, b = clamp_server.json("POST", "/v1/chat/completions", {"messages": USER, "max_tokens": C, "ignore_eos": True,
                                                               "temperature": 0})
    assert st == 200, b
    assert b["choices"][0]["finish_reason"] == "length"
    assert b["usage"]["prompt_tokens"] + b["usage"]["completion_tokens"] == C


# 8: /tokenize == usage.prompt_tokens --------------------------------------------------------------------------------

CONVERSATIONS = [
    {"messages": USER},
    {"messages": [{"role": "system", "content": "be brief"}, *USER]},
    {"messages": [{"role": "developer", "content": "dev"}, *USER]},
    {"messages": USER, "reasoning_effort": "none"},
    {"messages": USER, "reasoning_effort": "high"},
    {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": USER, "thinking": {"type": "disabled"}},
    {"messages": USER, "tools": TOOLS},
    {"messages": USER, "tools": TOOLS, "tool_choice": "none"},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
    {"messages": [*USER, {"role": "assistant", "content": "yo", "reasoning_content": "hmm"},
                  {"role": "user", "content": "again"}]},
    {"messages": [*USER, {"role": "assistant", "content": "yo", "reasoning": "hmm"}]},
    {"messages": [*USER, {"role": "assistant", "content": "<think>inline</think>ans"}, {"role": "user", "content": "q"}]},
    {"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "example", "arguments": "{\"latent\": \"x\", \"n\": 2}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}], "tools": TOOLS},
    {"messages": [*USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "example", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "example", "arguments": "{\"a\": [1, 2]}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"}, {"role": "tool", "tool_call_id": "c2", "content": "2"}],
     "tools": TOOLS},
    {"messages": [{"role": "user", "content": "中文 and emoji 😀 and <|assistant|> inside"}]},
    {"messages": [{"role": "user", "content": "{{ x }} {% if %}"}]},
    {"messages": USER, "chat_template_kwargs": {"clear_thinking": False}},
    {"messages": [{"role": "system", "content": "s"}, *USER, {"role": "assistant", "content": "a"},
                  {"role": "user", "content": "b"}], "reasoning_effort": "low"},
    {"messages": [{"role": "user", "content": "   spaces   \n\n newlines \t"}]},
]


@pytest.mark.parametrize("i", range(len(CONVERSATIONS)))
def test_tokenize_count_equals_prompt_tokens(server, i):
    req = CONVERSATIONS[i]
    st, t = server.json("POST", "/tokenize", req)
    assert st == 200, t
    st, r = server.json("POST", "/v1/chat/completions", {**req, "max_tokens": 1})
    assert st == 200, r
    assert t["count"] == r["usage"]["prompt_tokens"] == len(t["tokens"])
    assert t["max_model_len"] == 1024


# 9 + 10 + 12: streaming equals non-streaming; framing; tool calls ---------------------------------------------------

def test_stream_equals_non_stream_with_tool_call(client):
    kw = dict(model="tiny-glm", messages=USER, tools=TOOLS, temperature=0, seed=1)
    full = client.chat.completions.create(**kw)
    ch = full.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.tool_calls and len(ch.message.tool_calls) == 1
    tc = ch.message.tool_calls[0]
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", tc.id)
    assert tc.type == "function" and tc.function.name == "example"
    assert json.loads(tc.function.arguments) == {"latent": "Numbers"}
    assert ch.message.content is None
    reasoning = (ch.message.model_extra or {}).get("reasoning_content")
    assert reasoning == "Please check every token"
    assert (ch.message.model_extra or {}).get("reasoning") == reasoning
    chunks, content, sreason, calls, finish = collect_stream(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert content == ""
    assert sreason == reasoning
    assert calls == {0: {"name": "example", "arguments": tc.function.arguments}}
    assert finish == {0: "tool_calls"}
    assert chunks[-1].usage.model_dump() == full.usage.model_dump()


def test_stream_framing(server):
    st, h, body = server.request("POST", "/v1/chat/completions", {
        "messages": USER, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
        "logit_bias": no_tool(server), "reasoning_effort": "none"})
    assert st == 200
    assert h["content-type"].startswith("text/event-stream")
    assert h["cache-control"] == "no-cache"
    events = [e for e in body.decode().split("\n\n") if e]
    data = [e[6:] for e in events if e.startswith("data: ")]
    assert all(e.startswith("data: ") or e.startswith(":") for e in events)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    first = chunks[0]
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["finish_reason"] is None
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and re.fullmatch(r"chatcmpl-[0-9a-f]{32}", ids.pop())
    assert len({c["created"] for c in chunks}) == 1
    for c in chunks[:-2]:
        assert c["usage"] is None
        assert len(c["choices"]) == 1 and "finish_reason" in c["choices"][0]
        assert c["choices"][0]["finish_reason"] is None
    last = chunks[-2]
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert text == "Hello world, welcome!"
    # Without include_usage no chunk has a usage key.
    st, h, body = server.request("POST", "/v1/chat/completions", {"messages": USER, "stream": True, "max_tokens": 3})
    for e in body.decode().split("\n\n"):
        if e.startswith("data: {"):
            assert "usage" not in json.loads(e[6:])


# 11: stop strings ----------------------------------------------------------------------------------------------------

def test_stop_string_never_partially_streamed(server, client):
    kw = dict(model="tiny-glm", messages=USER, temperature=0, stop=["lo wor"], logit_bias=no_tool(server),
              reasoning_effort="none")
    full = client.chat.completions.create(**kw)
    assert full.choices[0].message.content == "Hel"
    assert full.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(**kw, stream=True))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == "Hel"
    assert not any("lo" in p for p in pieces)


# 13 + 14: thinking controls -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"reasoning_effort": "high"}, {"chat_template_kwargs": {"enable_thinking": True}}])
def test_thinking_on(server, kw):
    st, r = server.json("POST", "/v1/chat/completions", {"messages": USER, "temperature": 0, **kw})
    assert st == 200
    assert r["choices"][0]["message"]["reasoning_content"] == "Please check every token"
    st, t = server.json("POST", "/tokenize", {"messages": USER, "return_token_strs": True, **kw})
    assert t["token_strs"][-1] == "<think>"


@pytest.mark.parametrize("kw", [{"reasoning_effort": "none"}, {"chat_template_kwargs": {"enable_thinking": False}},
                                {"thinking": {"type": "disabled"}}])
def test_thinking_off(server, kw):
    st, t = server.json("POST", "/tokenize", {"messages": USER, "return_token_strs": True, **kw})
    assert t["token_strs"][-1] == "</think>"
    st, r = server.json("POST", "/v1/chat/completions", {"messages": USER, "temperature": 0,
                                                         "logit_bias": no_tool(server), **kw})
    m = r["choices"][0]["message"]
    assert m["reasoning_content"] is None and m["reasoning"] is None
    assert m["content"] == "Hello world, welcome!"


def test_reasoning_effort_bogus(server):
    assert_error(*server.json("POST", "/v1/chat/completions", {"messages": USER, "reasoning_effort": "bogus"}), 400,
                 "invalid_value", "reasoning_effort")


def test_include_reasoning_false_and_length_in_reasoning(server):
    st, r = server.json("POST", "/v1/chat/completions", {"messages": USER, "include_reasoning": False, "temperature": 0})
    assert "reasoning_content" not in r["choices"][0]["message"]
    st, r = server.json("POST", "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "temperature": 0})
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["choices"][0]["message"]["content"] is None
    assert r["choices"][0]["message"]["reasoning_content"] == "Please check"


# 15: usage ------------------------------------------------------------------------------------------------------------

def test_usage_invariants(client):
    r = client.chat.completions.create(model="tiny-alias", messages=USER, n=3, temperature=0)
    assert r.model == "tiny-alias"
    u = r.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.completion_tokens_details.reasoning_tokens <= u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens <= u.prompt_tokens
    assert len(r.choices) == 3 and [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.tool_calls is None for c in r.choices}) == 1
    one = client.chat.completions.create(model="tiny-glm", messages=USER, temperature=0)
    assert u.prompt_tokens == one.usage.prompt_tokens  # counted once for n > 1
    assert u.completion_tokens == 3 * one.usage.completion_tokens
    assert r.system_fingerprint and re.fullmatch(r"fp_[0-9a-f]{12}", r.system_fingerprint)


def test_logprobs(client, server):
    r = client.chat.completions.create(model="tiny-glm", messages=USER, temperature=0, logprobs=True, top_logprobs=3,
                                       logit_bias=no_tool(server), reasoning_effort="none")
    lp = r.choices[0].logprobs.content
    assert "".join(e.token for e in lp) == r.choices[0].message.content
    for e in lp:
        assert len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert bytes(e.bytes).decode() == e.token
        assert e.logprob <= 0


def test_seeded_sampling_reproducible(client):
    kw = dict(model="tiny-glm", messages=USER, temperature=1.5, seed=42, max_tokens=20, n=2,
              extra_body={"ignore_eos": True})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.message.model_dump() for c in a.choices] == [c.message.model_dump() for c in b.choices]


# completions ---------------------------------------------------------------------------------------------------------

def test_completions(client):
    r = client.completions.create(model="tiny-glm", prompt="Please", max_tokens=3, temperature=0)
    assert r.object == "text_completion" and re.fullmatch(r"cmpl-[0-9a-f]{32}", r.id)
    assert r.choices[0].text == " check every token"
    assert r.choices[0].finish_reason == "length"
    r = client.completions.create(model="tiny-glm", prompt=["Please", "Hello"], max_tokens=3, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[2].text == " world, welcome"
    assert r.usage.prompt_tokens == 2
    s = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny-glm", prompt="Please", max_tokens=3, temperature=0, stream=True) if c.choices)
    assert s == " check every token"
    r = client.completions.create(model="tiny-glm", prompt="Please", max_tokens=2, temperature=0, logprobs=2)
    assert r.choices[0].logprobs.tokens == [" check", " every"]
    assert r.choices[0].logprobs.text_offset == [0, 6]
    r = client.completions.create(model="tiny-glm", prompt=[726], max_tokens=1, temperature=0)
    assert r.choices[0].text == " check"


def test_tokenize_detokenize(server):
    st, t = server.json("POST", "/tokenize", {"prompt": "Hello world<|user|>", "return_token_strs": True})
    assert st == 200 and t["token_strs"] == ["Hello", "Ġworld", "<|user|>"]
    st, d = server.json("POST", "/detokenize", {"tokens": t["tokens"]})
    assert d == {"prompt": "Hello world<|user|>"}
    assert_error(*server.json("POST", "/detokenize", {"tokens": [1, 10 ** 6]}), 400, "invalid_value", "tokens[1]")


# 17: health, metrics -------------------------------------------------------------------------------------------------

PROM_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
                       r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)?\})? (-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$')


def test_health_models_metrics(server):
    st, h = server.json("GET", "/health")
    assert st == 200 and h == {"status": "ok"}
    st, _, b = server.request("HEAD", "/health")
    assert st == 200 and b == b""
    st, v = server.json("GET", "/version")
    assert set(v) >= {"version", "git_sha", "build_type", "cuda"}
    st, m = server.json("GET", "/v1/models")
    card = m["data"][0]
    assert card["id"] == "tiny-glm" and card["object"] == "model" and card["max_model_len"] == 1024
    assert card["meta"]["architecture"] == "GlmMoeDsaForCausalLM"
    assert card["meta"]["tool_parser"] == "glm47" and card["meta"]["reasoning_parser"] == "glm45"
    assert "precision_plan" in card["meta"]
    st, one = server.json("GET", "/v1/models/tiny-alias")
    assert one["id"] == "tiny-alias"
    st, h, b = server.request("GET", "/metrics")
    assert h["content-type"].startswith("text/plain; version=0.0.4")
    names = set()
    for line in b.decode().splitlines():
        if line.startswith("# HELP") or line.startswith("# TYPE"):
            continue
        assert PROM_LINE.match(line), line
        names.add(PROM_LINE.match(line).group(1))
    for n in ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
              "generation_tokens_total", "reasoning_tokens_total", "request_success_total", "requests_rejected_total",
              "requests_aborted_total", "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
              "e2e_request_latency_seconds_count", "request_queue_time_seconds_sum", "request_prompt_tokens_bucket",
              "request_generation_tokens_bucket", "kv_cache_blocks_used"]:
        assert "latent:" + n in names, n
