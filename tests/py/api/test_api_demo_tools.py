"""The trained demo model's tool calls and JSON answers (issue 16) through `latent serve` and the official openai
client: with the four tools it was trained on (tools/demo/tool_defs.json) and tool_choice auto it calls the right tool
with the right arguments, single and parallel, answers from the tool results, answers in JSON when asked (valid under
json_schema), and tool_choice none / required / named behave. Also /v1/completions echo with prompt logprobs (the
lm-evaluation-harness loglikelihood request: max_tokens 0). All greedy, so every answer is deterministic."""
import json
import os
import math
import re

import pytest

from conftest import ROOT, Server, _skip_reason

DEMO = ROOT / "models" / "latent-demo"
TOOLS = json.loads((ROOT / "tools" / "demo" / "tool_defs.json").read_text())


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    if not (DEMO / "model.safetensors").exists():
        pytest.skip(f"demo model not present at {DEMO}")
    # Measured in fp32 (the mode the figures in the model card come from), also where the device defaults to bf16.
    extra = [] if "--activations" in os.environ.get("LATENT_SERVE_ARGS", "") else ["--activations", "fp32"]
    s = Server(DEMO, extra, tmp_path_factory.mktemp("logs") / "demo_tools.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(demo):
    return demo.client()


@pytest.fixture(scope="module")
def tools_client(client, demo):
    # The first request with the tools prefills their ~830-token prompt cold; the later ones take it from the prefix
    # cache. Pay that once here, with a long timeout (on a loaded CI machine an ASan server took over the client's
    # 60 s), not in whichever test happens to run first.
    demo.client().with_options(timeout=600).chat.completions.create(
        model="tiny-glm", messages=[{"role": "user", "content": "Hi"}], tools=TOOLS, max_tokens=1, temperature=0)
    return client


def _chat(client, q, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 120)
    msgs = q if isinstance(q, list) else [{"role": "user", "content": q}]
    return client.chat.completions.create(model="tiny-glm", messages=msgs, **kw)


def _calls(r):
    return [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls or []]


def _validate(value, schema):
    import jsonschema
    jsonschema.validate(value, schema)


def _check_ids(r):
    for c in r.choices[0].message.tool_calls:
        assert c.type == "function" and re.fullmatch(r"call_[A-Za-z0-9]{24}", c.id)
        params = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == c.function.name)
        _validate(json.loads(c.function.arguments), params)


@pytest.mark.heavy  # tool calls: model behaviour, run in release (deselected under ASan)
@pytest.mark.parametrize("q,want", [
    ("What is the weather in Paris?", [("get_weather", {"city": "Paris"})]),
    ("What's the weather like in Tokyo?", [("get_weather", {"city": "Tokyo"})]),
    ("Look up the capital of Japan.", [("get_capital", {"country": "Japan"})]),
    ("Convert 5 kilometers to meters.", [("convert_units", {"value": 5, "from_unit": "kilometers", "to_unit": "meters"})]),
])
def test_auto_calls_the_right_tool_with_its_arguments(tools_client, q, want):
    r = _chat(tools_client, q, tools=TOOLS, tool_choice="auto")
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content is None
    assert _calls(r) == want
    _check_ids(r)


@pytest.mark.heavy  # tool calls: model behaviour, run in release (deselected under ASan)
def test_parallel_calls(tools_client):
    r = _chat(tools_client, "Tell me the weather in London and in Berlin.", tools=TOOLS)
    assert r.choices[0].finish_reason == "tool_calls"
    assert _calls(r) == [("get_weather", {"city": "London"}), ("get_weather", {"city": "Berlin"})]
    ids = [c.id for c in r.choices[0].message.tool_calls]
    assert len(set(ids)) == 2


@pytest.mark.heavy  # tool calls: model behaviour, run in release (deselected under ASan)
def test_no_call_when_no_tool_fits(tools_client):
    r = _chat(tools_client, "What color is grass?", tools=TOOLS)
    assert r.choices[0].finish_reason == "stop"
    assert not r.choices[0].message.tool_calls
    assert r.choices[0].message.content == "Grass is green."


@pytest.mark.heavy
def test_weather_round_trip(tools_client):
    """question -> get_weather call (auto) -> tool result -> the answer reads the result."""
    q = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = _chat(tools_client, q, tools=TOOLS)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    result = {"city": args["city"], "temperature": 21, "unit": "celsius", "condition": "sunny"}
    history = q + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
    ]
    final = _chat(tools_client, history, tools=TOOLS)
    ch = final.choices[0]
    assert ch.finish_reason == "stop" and not ch.message.tool_calls
    assert ch.message.content == "In Paris it is 21 degrees Celsius and sunny."
    # a different result gives a different answer: it is read from the tool response, not remembered
    history[-1]["content"] = json.dumps(dict(result, temperature=4, condition="rainy"))
    again = _chat(tools_client, history, tools=TOOLS).choices[0].message.content
    assert again == "In Paris it is 4 degrees Celsius and rainy."


@pytest.mark.heavy  # tool calls: model behaviour, run in release (deselected under ASan)
def test_tool_choice_none_answers_in_text(tools_client):
    for q in ("What is the weather in Paris?", "What is the capital of Japan?"):
        r = _chat(tools_client, q, tools=TOOLS, tool_choice="none")
        m = r.choices[0].message
        assert not m.tool_calls
        assert "<tool_call>" not in (m.content or "") and "<arg_key>" not in (m.content or "")
    assert r.choices[0].message.content == "The capital of Japan is Tokyo."


@pytest.mark.heavy
def test_tool_choice_required_and_named(tools_client):
    r = _chat(tools_client, "Look up the capital of Japan.", tools=TOOLS, tool_choice="required")
    assert r.choices[0].finish_reason == "tool_calls" and _calls(r) == [("get_capital", {"country": "Japan"})]
    # named: the call is forced to that tool with schema-valid arguments, even where the model would pick another
    r = _chat(tools_client, "What is the weather in Paris?", tools=TOOLS,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert _calls(r) == [("get_weather", {"city": "Paris"})]
    r = _chat(tools_client, "What is the weather in Paris?", tools=TOOLS,
              tool_choice={"type": "function", "function": {"name": "get_capital"}})
    assert r.choices[0].finish_reason == "tool_calls"
    assert [n for n, _ in _calls(r)] == ["get_capital"]
    _check_ids(r)


@pytest.mark.heavy
def test_streaming_tool_call_deltas_equal_non_streaming(tools_client):
    q = "Tell me the weather in London and in Berlin."
    full = _chat(tools_client, q, tools=TOOLS)
    calls, finish = {}, None
    for chunk in _chat(tools_client, q, tools=TOOLS, stream=True):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        for d in c.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                assert slot["id"] is None
                slot["id"] = d.id
            if d.function and d.function.name:
                slot["name"] = d.function.name
            if d.function and d.function.arguments:
                slot["arguments"] += d.function.arguments
        finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert sorted(calls) == [0, 1]
    assert [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in (0, 1)] == _calls(full)


CAPITAL = {"type": "object", "properties": {"country": {"type": "string", "maxLength": 40},
                                            "capital": {"type": "string", "maxLength": 40}},
           "required": ["country", "capital"], "additionalProperties": False}


def test_json_answer_when_asked(client):
    q = "What is the capital of France? Answer in JSON."
    plain = _chat(client, q).choices[0].message.content
    assert json.loads(plain) == {"country": "France", "capital": "Paris"}
    for rf in ({"type": "json_schema", "json_schema": {"name": "capital", "schema": CAPITAL, "strict": True}},
               {"type": "json_object"}):
        r = _chat(client, q, response_format=rf)
        assert r.choices[0].finish_reason == "stop"
        value = json.loads(r.choices[0].message.content)
        _validate(value, CAPITAL)
        assert value == {"country": "France", "capital": "Paris"}


def _score(client, prompt):
    r = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    ch = r.choices[0]
    return ch, r


def test_echo_max_tokens_0_returns_the_prompt_and_its_logprobs(client):
    prompt = "The capital of France is Paris."
    ch, r = _score(client, prompt)
    assert ch.text == prompt and ch.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ch.logprobs.tokens)
    lp = ch.logprobs
    assert "".join(lp.tokens) == prompt
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first token has no context
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for tok, x, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert len(top) == 1
        (best, best_lp), = top.items()
        assert best_lp >= x - 1e-6 and (best != tok or abs(best_lp - x) < 1e-6)
    # loglikelihood ranking (lm-evaluation-harness style): the trained fact scores higher than a wrong one
    wrong, _ = _score(client, "The capital of France is Tokyo.")
    assert sum(lp.token_logprobs[1:]) > sum(wrong.logprobs.token_logprobs[1:])


def test_echo_logprobs_agree_with_generated_logprobs(client):
    """Scoring prompt + continuation gives the continuation's tokens the logprobs they had when generated."""
    prompt = "<|user|>What is the capital of Japan?<|assistant|><think>"
    g = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=12, temperature=0, logprobs=2)
    gen = g.choices[0].logprobs
    full = client.completions.create(model="tiny-glm", prompt=g.choices[0].logprobs.tokens and
                                     (prompt + "".join(gen.tokens)), max_tokens=0, echo=True, logprobs=2)
    e = full.choices[0].logprobs
    n = len(gen.tokens)
    assert e.tokens[-n:] == gen.tokens
    for a, b in zip(e.token_logprobs[-n:], gen.token_logprobs):
        assert math.isclose(a, b, abs_tol=2e-3), (a, b)
    for a, b in zip(e.top_logprobs[-n:], gen.top_logprobs):
        assert list(a) == list(b)
    # echo with generation: the prompt's entries first, then the generated ones (equal to the plain request)
    both = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=12, temperature=0, logprobs=2,
                                     echo=True)
    b = both.choices[0]
    assert b.text == prompt + g.choices[0].text
    assert b.logprobs.tokens[-n:] == gen.tokens and b.logprobs.token_logprobs[-n:] == gen.token_logprobs
    assert b.logprobs.token_logprobs[0] is None
    # streaming echo: the first chunk is the prompt with its logprobs, then the generated tokens
    chunks = [c.choices[0] for c in client.completions.create(
        model="tiny-glm", prompt=prompt, max_tokens=12, temperature=0, logprobs=2, echo=True, stream=True) if c.choices]
    assert chunks[0].text == prompt
    assert "".join(c.text for c in chunks) == b.text
    assert [x for c in chunks if c.logprobs for x in c.logprobs.token_logprobs] == b.logprobs.token_logprobs


def test_echo_is_recomputed_when_the_prefix_is_cached(client):
    """A second identical scoring request (its prefix now in the prefix cache) returns the same logprobs."""
    prompt = "What is the capital of Peru? " * 8
    a, _ = _score(client, prompt)
    b, _ = _score(client, prompt)
    assert a.logprobs.token_logprobs == b.logprobs.token_logprobs
    assert len(b.logprobs.token_logprobs) == len(b.logprobs.tokens)


def test_echo_without_logprobs_needs_no_prompt_rows(client):
    """Echo alone: the prompt text first (max_tokens 0 allowed), no logprobs; the engine then computes only the last
    row, so the request takes the prefix cache like any other (an all-rows scoring request does not)."""
    prompt = "What is the capital of Chile? " * 12
    r = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=0, echo=True)
    ch = r.choices[0]
    assert ch.text == prompt and ch.logprobs is None and ch.finish_reason == "length"
    again = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=0, echo=True)
    assert again.choices[0].text == prompt
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    g = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=4, temperature=0)
    e = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=4, temperature=0, echo=True)
    assert e.choices[0].text == prompt + g.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny-glm", prompt=prompt, max_tokens=4, temperature=0, echo=True, stream=True) if c.choices)
    assert streamed == e.choices[0].text


def test_logprobs_without_echo_unchanged(client):
    prompt = "The capital of France is"
    r = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=3, temperature=0, logprobs=1)
    ch = r.choices[0]
    assert not ch.text.startswith(prompt)
    assert len(ch.logprobs.tokens) == 3 and None not in ch.logprobs.token_logprobs
    assert ch.logprobs.text_offset[0] == 0
    e = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=3, temperature=0, echo=False)
    assert e.choices[0].text == ch.text and e.choices[0].logprobs is None


@pytest.mark.heavy
def test_echo_logprobs_equal_latent_logits(client, tmp_path):
    """The echoed prompt logprobs are log_softmax of `latent logits` (the same model, every position) at the next
    prompt token, and the top alternatives are its argmax."""
    import subprocess

    import numpy as np

    from conftest import _latent_bin
    # [gMASK]<sop><|user|> + 300 ordinary tokens: more than one prefill chunk (256), past index_topk (16)
    prompt = [4013, 4015, 4018] + list(range(300, 600))
    r = client.completions.create(model="tiny-glm", prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(prompt) and lp.token_logprobs[0] is None
    out = tmp_path / "logits.npy"
    subprocess.run([_latent_bin(), "logits", "--model", str(DEMO), "--tokens", " ".join(map(str, prompt)),
                    "--out", str(out)], check=True, capture_output=True, timeout=120)
    x = np.load(out).astype(np.float64)
    ls = x - x.max(-1, keepdims=True)
    ls = ls - np.log(np.exp(ls).sum(-1, keepdims=True))
    for p in range(1, len(prompt)):
        assert abs(lp.token_logprobs[p] - ls[p - 1, prompt[p]]) < 2e-3, p
        (best_lp,) = lp.top_logprobs[p].values()
        assert abs(best_lp - ls[p - 1].max()) < 2e-3, p


def test_echo_several_prompts_and_choices(client):
    """Each prompt's choices echo that prompt (its own logprobs); streaming gives the same texts."""
    prompts = ["The capital of France is", "Hello"]
    r = client.completions.create(model="tiny-glm", prompt=prompts, max_tokens=0, echo=True, logprobs=0, n=2)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [prompts[0]] * 2 + [prompts[1]] * 2
    by = {c.index: c.logprobs.token_logprobs for c in r.choices}
    assert by[0] == by[1] and by[2] == by[3] == [None] and len(by[0]) == 5
    g = client.completions.create(model="tiny-glm", prompt=prompts, max_tokens=3, echo=True, n=2, temperature=0)
    texts = {c.index: c.text for c in g.choices}
    assert all(texts[i].startswith(prompts[i // 2]) and len(texts[i]) > len(prompts[i // 2]) for i in range(4))
    streamed = {}
    for ch in client.completions.create(model="tiny-glm", prompt=prompts, max_tokens=3, echo=True, n=2,
                                        temperature=0, stream=True):
        for c in ch.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == texts
