"""Smoke test on the bundled trained demo model (models/latent-demo), when present: a real answer through
`latent serve` and the official client, reasoning split, thinking off, streaming equal to non-streaming."""
from pathlib import Path

import pytest

from conftest import ROOT, Server, _skip_reason

DEMO = ROOT / "models" / "latent-demo"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    if not (DEMO / "model.safetensors").exists() or not (DEMO / "tokenizer.json").exists():
        pytest.skip(f"demo model not present at {DEMO}")
    s = Server(DEMO, [], tmp_path_factory.mktemp("logs") / "demo.log")
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
