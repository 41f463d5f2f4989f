"""More than 100 malformed requests (bad JSON, wrong types, unknown model, negative or huge max_tokens, huge n, empty
messages, invalid roles, oversize body, bad auth): each gets the right 4xx with the OpenAI error envelope, and the
server keeps serving."""
import json

import pytest

U = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f"}}


def chat(**kw):
    return {"messages": U, **kw}


CASES = [
    # (path, body, status, code, param)
    ("/v1/chat/completions", "", 400, "invalid_json", None),
    ("/v1/chat/completions", "{", 400, "invalid_json", None),
    ("/v1/chat/completions", "[]", 400, "invalid_json", None),
    ("/v1/chat/completions", "null", 400, "invalid_json", None),
    ("/v1/chat/completions", "123", 400, "invalid_json", None),
    ("/v1/chat/completions", '"str"', 400, "invalid_json", None),
    ("/v1/chat/completions", "{'single': 1}", 400, "invalid_json", None),
    ("/v1/chat/completions", '{"a":1,}', 400, "invalid_json", None),
    ("/v1/chat/completions", b'{"messages": "\xff"}', 400, "invalid_json", None),
    ("/v1/chat/completions", '{"messages": [}', 400, "invalid_json", None),
    ("/v1/chat/completions", "{}", 400, "missing_required_parameter", "messages"),
    ("/v1/chat/completions", {"messages": None}, 400, "missing_required_parameter", "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "invalid_type", "messages"),
    ("/v1/chat/completions", {"messages": {"role": "user"}}, 400, "invalid_type", "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "invalid_value", "messages"),
    ("/v1/chat/completions", {"messages": [None]}, 400, "invalid_type", "messages[0]"),
    ("/v1/chat/completions", {"messages": [1]}, 400, "invalid_type", "messages[0]"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "missing_required_parameter", "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_value", "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "function", "content": "x"}]}, 400, "invalid_value", "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "", "content": "x"}]}, 400, "invalid_value", "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": ["user"], "content": "x"}]}, 400, "invalid_type", "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "missing_required_parameter", "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "invalid_type", "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
     400, "unsupported_parameter", "messages[0].content[0].type"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400,
     "missing_required_parameter", "messages[0].content[0].text"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "missing_required_parameter",
     "messages[0].tool_call_id"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "not json"}}]}]}, 400, "invalid_value",
     "messages[0].tool_calls[0].function.arguments"),
    ("/v1/chat/completions", {"messages": [*U, {"role": "x", "content": "y"}]}, 400, "invalid_value", "messages[1].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 4097}, 400, "invalid_value", "messages"),
    ("/v1/chat/completions", chat(model="unknown-model"), 404, "model_not_found", "model"),
    ("/v1/chat/completions", chat(model=""), 404, "model_not_found", "model"),
    ("/v1/chat/completions", chat(model=7), 400, "invalid_type", "model"),
    ("/v1/chat/completions", chat(stream="true"), 400, "invalid_type", "stream"),
    ("/v1/chat/completions", chat(stream_options={"include_usage": True}), 400, "invalid_value", "stream_options"),
    ("/v1/chat/completions", chat(max_tokens=0), 400, "invalid_value", "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens=-1), 400, "invalid_value", "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens=-(2 ** 62)), 400, "invalid_value", "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens=2 ** 62), 400, "context_length_exceeded", "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens=10 ** 30), 400, "invalid_type", "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens=2.0), 400, "invalid_type", "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens="5"), 400, "invalid_type", "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens=True), 400, "invalid_type", "max_tokens"),
    ("/v1/chat/completions", chat(max_completion_tokens=-3), 400, "invalid_value", "max_completion_tokens"),
    ("/v1/chat/completions", chat(max_completion_tokens=100000), 400, "context_length_exceeded", "max_completion_tokens"),
    ("/v1/chat/completions", chat(temperature=-1), 400, "invalid_value", "temperature"),
    ("/v1/chat/completions", chat(temperature=2.0001), 400, "invalid_value", "temperature"),
    ("/v1/chat/completions", chat(temperature="0.5"), 400, "invalid_type", "temperature"),
    ("/v1/chat/completions", chat(temperature=None, top_p=0), 400, "invalid_value", "top_p"),
    ("/v1/chat/completions", chat(top_p=-0.5), 400, "invalid_value", "top_p"),
    ("/v1/chat/completions", chat(top_p=[1]), 400, "invalid_type", "top_p"),
    ("/v1/chat/completions", chat(top_k=-5), 400, "invalid_value", "top_k"),
    ("/v1/chat/completions", chat(top_k=10 ** 9), 400, "invalid_value", "top_k"),
    ("/v1/chat/completions", chat(top_k=1.5), 400, "invalid_type", "top_k"),
    ("/v1/chat/completions", chat(min_p=2), 400, "invalid_value", "min_p"),
    ("/v1/chat/completions", chat(presence_penalty=2.5), 400, "invalid_value", "presence_penalty"),
    ("/v1/chat/completions", chat(frequency_penalty=-3), 400, "invalid_value", "frequency_penalty"),
    ("/v1/chat/completions", chat(repetition_penalty=0), 400, "invalid_value", "repetition_penalty"),
    ("/v1/chat/completions", chat(repetition_penalty=-1), 400, "invalid_value", "repetition_penalty"),
    ("/v1/chat/completions", chat(logit_bias=[]), 400, "invalid_type", "logit_bias"),
    ("/v1/chat/completions", chat(logit_bias={"x": 1}), 400, "invalid_value", "logit_bias"),
    ("/v1/chat/completions", chat(logit_bias={"99999999": 1}), 400, "invalid_value", "logit_bias"),
    ("/v1/chat/completions", chat(logit_bias={"1": 500}), 400, "invalid_value", "logit_bias"),
    ("/v1/chat/completions", chat(logit_bias={str(i): 1 for i in range(1025)}), 400, "invalid_value", "logit_bias"),
    ("/v1/chat/completions", chat(n=0), 400, "invalid_value", "n"),
    ("/v1/chat/completions", chat(n=-1), 400, "invalid_value", "n"),
    ("/v1/chat/completions", chat(n=17), 400, "invalid_value", "n"),
    ("/v1/chat/completions", chat(n=10 ** 9), 400, "invalid_value", "n"),
    ("/v1/chat/completions", chat(n="2"), 400, "invalid_type", "n"),
    ("/v1/chat/completions", chat(seed="x"), 400, "invalid_type", "seed"),
    ("/v1/chat/completions", chat(seed=2 ** 64 - 1), 400, "invalid_value", "seed"),
    ("/v1/chat/completions", chat(stop=""), 400, "invalid_value", "stop"),
    ("/v1/chat/completions", chat(stop=[""]), 400, "invalid_value", "stop[0]"),
    ("/v1/chat/completions", chat(stop=7), 400, "invalid_type", "stop"),
    ("/v1/chat/completions", chat(stop=["a"] * 17), 400, "invalid_value", "stop"),
    ("/v1/chat/completions", chat(stop="x" * 300), 400, "invalid_value", "stop"),
    ("/v1/chat/completions", chat(stop_token_ids=[-1]), 400, "invalid_value", "stop_token_ids[0]"),
    ("/v1/chat/completions", chat(stop_token_ids=[10 ** 6]), 400, "invalid_value", "stop_token_ids[0]"),
    ("/v1/chat/completions", chat(stop_token_ids="1"), 400, "invalid_type", "stop_token_ids"),
    ("/v1/chat/completions", chat(ignore_eos=1), 400, "invalid_type", "ignore_eos"),
    ("/v1/chat/completions", chat(logprobs="yes"), 400, "invalid_type", "logprobs"),
    ("/v1/chat/completions", chat(top_logprobs=2), 400, "invalid_value", "top_logprobs"),
    ("/v1/chat/completions", chat(logprobs=True, top_logprobs=50), 400, "invalid_value", "top_logprobs"),
    ("/v1/chat/completions", chat(tools=[]), 400, "invalid_value", "tools"),
    ("/v1/chat/completions", chat(tools="f"), 400, "invalid_type", "tools"),
    ("/v1/chat/completions", chat(tools=[{"type": "retrieval"}]), 400, "unsupported_parameter", "tools[0].type"),
    ("/v1/chat/completions", chat(tools=[{"type": "function"}]), 400, "missing_required_parameter", "tools[0].function"),
    ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "a b"}}]), 400, "invalid_value",
     "tools[0].function.name"),
    ("/v1/chat/completions", chat(tools=[TOOL, TOOL]), 400, "invalid_value", "tools[1].function.name"),
    ("/v1/chat/completions", chat(tools=[TOOL] * 129), 400, "invalid_value", "tools"),
    ("/v1/chat/completions", chat(tool_choice="auto"), 400, "invalid_value", "tool_choice"),
    ("/v1/chat/completions", chat(tool_choice="always", tools=[TOOL]), 400, "invalid_value", "tool_choice"),
    ("/v1/chat/completions", chat(tool_choice="required", tools=[TOOL], guided_regex="a"), 400, "invalid_value",
     "guided_regex"),
    ("/v1/chat/completions", chat(tool_choice={"type": "function", "function": {"name": "g"}}, tools=[TOOL]), 400,
     "invalid_value", "tool_choice.function.name"),
    ("/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}}}}), 400, "unsupported_parameter",
     "response_format.json_schema.schema"),
    ("/v1/chat/completions", chat(guided_regex="(a"), 400, "invalid_value", "guided_regex"),
    ("/v1/chat/completions", chat(response_format={"type": "yaml"}), 400, "invalid_value", "response_format.type"),
    ("/v1/chat/completions", chat(reasoning_effort="ultra"), 400, "invalid_value", "reasoning_effort"),
    ("/v1/chat/completions", chat(reasoning_effort=3), 400, "invalid_type", "reasoning_effort"),
    ("/v1/chat/completions", chat(chat_template_kwargs="x"), 400, "invalid_type", "chat_template_kwargs"),
    ("/v1/chat/completions", chat(chat_template_kwargs={"enable_thinking": "no"}), 400, "invalid_type",
     "chat_template_kwargs.enable_thinking"),
    ("/v1/chat/completions", chat(thinking={"type": "maybe"}), 400, "invalid_value", "thinking"),
    ("/v1/chat/completions", chat(chat_template="{{ 1 }}"), 400, "invalid_value", "chat_template"),
    ("/v1/chat/completions", chat(continue_final_message=True), 400, "invalid_value", "continue_final_message"),
    ("/v1/chat/completions", chat(functions=[{"name": "f"}]), 400, "unsupported_parameter", "functions"),
    ("/v1/chat/completions", chat(audio={"voice": "v"}), 400, "unsupported_parameter", "audio"),
    ("/v1/chat/completions", chat(modalities=["audio"]), 400, "unsupported_parameter", "modalities"),
    ("/v1/chat/completions", chat(echo=True), 400, "unsupported_parameter", "echo"),
    ("/v1/chat/completions", chat(include_stop_str_in_output=True), 400, "unsupported_parameter", "include_stop_str_in_output"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 1200}]}, 400, "context_length_exceeded",
     "messages"),
    ("/v1/completions", "{}", 400, "missing_required_parameter", "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "invalid_value", "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "invalid_value", "prompt"),
    ("/v1/completions", {"prompt": [1, -1]}, 400, "invalid_value", "prompt[1]"),
    ("/v1/completions", {"prompt": [[1], "x"]}, 400, "invalid_type", "prompt[1]"),
    ("/v1/completions", {"prompt": ["x"] * 65}, 400, "invalid_value", "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -2}, 400, "invalid_value", "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, 400, "context_length_exceeded", "max_tokens"),
    ("/v1/completions", {"prompt": "x", "n": 100}, 400, "invalid_value", "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": 9}, 400, "invalid_value", "logprobs"),
    ("/v1/completions", {"prompt": "x", "echo": "yes"}, 400, "invalid_type", "echo"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "invalid_value", "max_tokens"),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, 400, "unsupported_parameter", "suffix"),
    ("/v1/completions", {"prompt": "x", "best_of": 2}, 400, "unsupported_parameter", "best_of"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model_not_found", "model"),
    ("/v1/completions", {"prompt": "word " * 1200}, 400, "context_length_exceeded", "prompt"),
    ("/tokenize", "{}", 400, "invalid_value", "prompt"),
    ("/tokenize", {"prompt": "a", "messages": U}, 400, "invalid_value", "messages"),
    ("/tokenize", {"messages": [{"role": "bad", "content": "x"}]}, 400, "invalid_value", "messages[0].role"),
    ("/detokenize", {"tokens": "1"}, 400, "invalid_type", "tokens"),
    ("/detokenize", {}, 400, "missing_required_parameter", "tokens"),
    ("/detokenize", {"tokens": [10 ** 7]}, 400, "invalid_value", "tokens[0]"),
]


def test_case_count():
    assert len(CASES) >= 100


@pytest.mark.parametrize("i", range(len(CASES)))
def test_malformed(server, i):
    path, body, status, code, param = CASES[i]
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    st, h, raw = server.request("POST", path, body, {"Content-Type": "application/json"})
    assert st == status, raw[:300]
    assert h["content-type"].startswith("application/json")
    e = json.loads(raw)
    assert set(e) == {"error"} and set(e["error"]) == {"message", "type", "param", "code"}
    assert e["error"]["code"] == code, e
    assert e["error"]["param"] == param, e
    assert e["error"]["type"] == "invalid_request_error"


def test_transport_errors_and_still_serving(server, auth_server):
    # Wrong method, unknown route, oversize body, bad auth.
    st, h, b = server.request("DELETE", "/v1/chat/completions")
    assert st == 405 and json.loads(b)["error"]["code"] == "method_not_allowed"
    st, h, b = server.request("GET", "/v1/embeddings")
    assert st == 404
    st, h, b = auth_server.request("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}),
                                   {"Authorization": "Bearer sk-test-1"})
    assert st == 413 and json.loads(b)["error"]["code"] == "request_too_large"
    for hdr in [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic sk-test-1"}, {"x-api-key": "sk-test"}]:
        st, h, b = auth_server.request("POST", "/v1/chat/completions", json.dumps({"messages": U}), hdr)
        assert st == 401 and json.loads(b)["error"]["code"] == "invalid_api_key"
    # The servers are still healthy and serving.
    st, r = server.json("POST", "/v1/chat/completions", {"messages": U, "max_tokens": 3})
    assert st == 200 and r["usage"]["completion_tokens"] == 3
    st, r = auth_server.json("POST", "/v1/chat/completions", {"messages": U, "max_tokens": 2},
                             {"Authorization": "Bearer sk-test-2"})
    assert st == 200
    assert server.metric("requests_rejected_total", 'reason="validation"') >= 80
