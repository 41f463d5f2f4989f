"""Smoke test on the bundled trained demo model (models/latent-demo), when present: a real answer through
`latent serve` and the official client, reasoning split, thinking off, streaming equal to non-streaming."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, Server, _latent_bin, _skip_reason

DEMO = ROOT / "models" / "latent-demo"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    if not (DEMO / "model.safetensors").exists() or not (DEMO / "tokenizer.json").exists():
        pytest.skip(f"demo model not present at {DEMO}")
    # The fixtures are transformers' fp32 greedy outputs: compare in the fp32 mode also where the device's default is
    # bf16 (LATENT_SERVE_ARGS="--device cuda"; the bf16 CUDA path is checked against the ref backend's bf16 emulation
    # by test_cuda).
    extra = [] if "--activations" in os.environ.get("LATENT_SERVE_ARGS", "") else ["--activations", "fp32"]
    s = Server(DEMO, extra, tmp_path_factory.mktemp("logs") / "demo.log")
    yield s
    s.stop()


def test_demo_answers(demo):
    c = demo.client()
    q = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat.completions.create(model="tiny-glm", messages=q, temperature=0, max_tokens=80)
    m = r.choices[0].message
    assert "Paris" in (m.content or "")
    assert (m.model_extra or {}).get("reasoning_content")
    assert r.choices[0].finish_reason == "stop"
    off = c.chat.completions.create(model="tiny-glm", messages=q, temperature=0, max_tokens=80, reasoning_effort="none")
    assert (off.choices[0].message.model_extra or {}).get("reasoning_content") is None
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="tiny-glm", messages=q, temperature=0, max_tokens=80, stream=True) if ch.choices)
    assert text == m.content


GOLDEN = ROOT / "tests" / "golden" / "latent-demo"


def _fixtures():
    return json.loads((GOLDEN / "greedy.json").read_text())


def _chat(demo, messages, thinking, max_tokens=64):
    st, r = demo.json("POST", "/v1/chat/completions", {
        "model": "tiny-glm", "messages": messages, "temperature": 0, "max_tokens": max_tokens,
        "chat_template_kwargs": {"enable_thinking": thinking}})
    assert st == 200, r
    return r["choices"][0]


@pytest.mark.heavy
def test_demo_heldout_capitals(demo):
    """Issue 7: >= 90 % of the held-out capital questions (phrasings never seen in training) answered under greedy
    decoding through the server; the long phrasings run the sparse DSA path (prompt > index_topk = 16)."""
    data = json.loads((GOLDEN / "heldout_capitals.json").read_text())
    for split in ("capitals_heldout", "capitals_long"):
        items = data[split]
        wrong = []
        for it in items:
            ch = _chat(demo, it["messages"], True)
            if it["expect"] not in (ch["message"]["content"] or ""):
                wrong.append((it["messages"][0]["content"], ch["message"]["content"]))
        acc = 1 - len(wrong) / len(items)
        print(f"{split}: {acc:.3f} ({len(items) - len(wrong)}/{len(items)})")
        assert acc >= 0.90, (split, acc, wrong[:10])


def test_demo_render_and_tokens_match_transformers():
    """The chat template renders each fixture's prompt byte for byte, and the tokenizer gives the same ids."""
    fx = _fixtures()
    for it in fx["items"]:
        msgs = Path(os.environ.get("TMPDIR", "/tmp")) / f"latent-demo-msgs-{os.getpid()}.json"
        msgs.write_text(json.dumps(it["messages"]))
        try:
            p = subprocess.run([_latent_bin(), "render", "--model", str(DEMO), "--messages", str(msgs), "--kwargs",
                                json.dumps({"enable_thinking": it["enable_thinking"]})],
                               capture_output=True, text=True, check=True)
        finally:
            msgs.unlink()
        assert p.stdout == it["prompt"], it["name"]
        t = subprocess.run([_latent_bin(), "tokenize", "--model", str(DEMO), "--text", it["prompt"]],
                           capture_output=True, text=True, check=True)
        assert json.loads(t.stdout) == it["prompt_ids"], it["name"]


@pytest.mark.heavy
def test_demo_greedy_tokens_match_transformers():
    """Issue 7: on the 50 fixture prompts, latent's greedy ids equal transformers' (GlmMoeDsaForCausalLM.generate,
    fp32 eager, MXFP4 experts dequantized, up to 64 new tokens, stopping at the EOS set)."""
    fx = _fixtures()
    bad = []
    for it in fx["items"]:
        n = fx["max_new_tokens"]
        p = subprocess.run([_latent_bin(), "run", "--model", str(DEMO), "--prompt-tokens",
                            " ".join(map(str, it["prompt_ids"])), "--max-tokens", str(n)],
                           capture_output=True, text=True, check=True)
        ids = [int(x) for x in p.stdout.splitlines()[0].split()]
        if ids != it["generated_ids"]:
            bad.append((it["name"], ids, it["generated_ids"]))
    assert not bad, bad[:3]


@pytest.mark.heavy
def test_demo_chat_matches_transformers(demo):
    """The same fixtures through the serving path: reasoning_content and content equal transformers' text."""
    fx = _fixtures()
    for it in fx["items"]:
        ch = _chat(demo, it["messages"], it["enable_thinking"], fx["max_new_tokens"])
        m = ch["message"]
        assert (m.get("content") or "") == it["content"], it["name"]
        assert (m.get("reasoning_content") or "") == (it["reasoning"] or ""), it["name"]
        assert ch["finish_reason"] == ("stop" if it["generated_ids"][-1] in fx["eos_token_id"] else "length")


def test_run_chat_uses_the_bundled_model():
    """`latent run --chat` without --model: the bundled demo model, through the serving path (template, reasoning
    split), prints the reasoning between <think> tags (not a terminal) and the answer; finish_reason on stderr."""
    p = subprocess.run([_latent_bin(), "run", "--chat", "What is the capital of France?"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    reasoning, _, answer = p.stdout.partition("</think>")
    assert reasoning.startswith("<think>") and len(reasoning) > len("<think>") + 5
    assert "Paris" in answer
    assert "finish_reason stop" in p.stderr
    off = subprocess.run([_latent_bin(), "run", "--chat", "What is the capital of France?", "--no-think"],
                         capture_output=True, text=True, timeout=120)
    assert off.returncode == 0 and "<think>" not in off.stdout and "Paris" in off.stdout
    bad = subprocess.run([_latent_bin(), "run", "--chat", "hi", "--model", "/nonexistent"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "/nonexistent" in bad.stderr


def test_serve_lossy_transform_guard_and_listing(tmp_path):
    """Issue 6: `serve --quantize '*.kv_b_proj=mxfp4'` refuses to start, naming each tensor and its error; with
    --allow-lossy it serves, logs the lossy plan and lists the transforms with their rel_error on /v1/models."""
    p = subprocess.run([_latent_bin(), "serve", "--port", "0", "--quantize", "*.kv_b_proj=mxfp4"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    for i in range(4):
        assert f"model.layers.{i}.self_attn.kv_b_proj.weight rel_error 0.1" in p.stderr
    assert "--allow-lossy" in p.stderr
    s = Server(DEMO, ["--quantize", "*.kv_b_proj=mxfp4", "--allow-lossy"], tmp_path / "lossy.log")
    try:
        st, models = s.json("GET", "/v1/models")
        assert st == 200
        meta = models["data"][0]["meta"]
        assert meta["lossy"] is True
        tr = meta["precision_plan"]["lossy_transforms"]
        assert sorted(t["tensor"] for t in tr) == [f"model.layers.{i}.self_attn.kv_b_proj.weight" for i in range(4)]
        assert all(0.10 < t["rel_error"] < 0.13 and "mxfp4" in t["transform"] for t in tr)
        ch = _chat(s, [{"role": "user", "content": "What is the capital of France?"}], True)
        assert "Paris" in ch["message"]["content"]
    finally:
        s.stop()
    log = (tmp_path / "lossy.log").read_text()
    assert "guard lifted by --allow-lossy" in log and "bf16->mxfp4" in log
    bad = subprocess.run([_latent_bin(), "serve", "--port", "0", "--model", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "no such model directory" in bad.stderr


@pytest.mark.heavy
def test_demo_bf16_activations_top1(tmp_path):
    """Issue 3: bf16 activations agree with the fp32 forward on >= 99 % of next-token argmaxes, over every position of
    the 50 fixture conversations (prompt + transformers' greedy continuation) on the trained demo model. (The tiny
    random-weight models have near-tied logits; their bf16 test in tests/model forces the discrete decisions.)"""
    import numpy as np
    agree = total = 0
    for i, it in enumerate(_fixtures()["items"]):
        toks = " ".join(map(str, it["prompt_ids"] + it["generated_ids"]))
        out = {}
        for act in ("fp32", "bf16"):
            f = tmp_path / f"{act}_{i}.npy"
            subprocess.run([_latent_bin(), "logits", "--model", str(DEMO), "--tokens", toks, "--activations", act,
                            "--out", str(f)], capture_output=True, text=True, check=True)
            out[act] = np.load(f)
        assert out["fp32"].shape == out["bf16"].shape == (len(toks.split()), 4032)
        agree += int((out["fp32"].argmax(1) == out["bf16"].argmax(1)).sum())
        total += out["fp32"].shape[0]
    print(f"bf16 vs fp32 top-1 agreement: {agree}/{total} = {agree / total:.4f}")
    assert agree / total >= 0.99
