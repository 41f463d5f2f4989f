"""`latent serve --tensor-parallel-size 2 [--expert-parallel]` on the CPU (ranks as threads): the bundled demo model
answers exactly as one rank does (greedy chat, reasoning split, streaming), and a refused layout fails at start
with the reason."""
import os
import shlex
import shutil
import subprocess

import pytest

from conftest import ROOT, Server, _latent_bin, _skip_reason

DEMO = ROOT / "models" / "latent-demo"

PROMPTS = ["What is the capital of France?", "What is the capital of Japan?", "Say hello."]


def _visible_gpus():
    if not shutil.which("nvidia-smi"):
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))


def _need_demo():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    args = shlex.split(os.environ.get("LATENT_SERVE_ARGS", ""))
    if "cuda" in args and _visible_gpus() < 2:  # (scripts/gpu_parallel_test runs this on a 2+ GPU machine)
        pytest.skip("--device cuda with fewer than 2 GPUs: no room for 2 ranks")
    if not (DEMO / "model.safetensors").exists() or not (DEMO / "tokenizer.json").exists():
        pytest.skip(f"demo model not present at {DEMO}")


def _answers(s):
    c = s.client()
    out = []
    for p in PROMPTS:
        r = c.chat.completions.create(model="tiny-glm", messages=[{"role": "user", "content": p}], temperature=0,
                                      max_tokens=48)
        m = r.choices[0].message
        out.append((m.content, (m.model_extra or {}).get("reasoning_content"), r.choices[0].finish_reason,
                    r.usage.completion_tokens))
    stream = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="tiny-glm", messages=[{"role": "user", "content": PROMPTS[0]}], temperature=0, max_tokens=48,
        stream=True) if ch.choices)
    return out, stream


def test_tensor_and_expert_parallel_serve_equal_one_rank(tmp_path):
    _need_demo()
    one = Server(DEMO, [], tmp_path / "one.log")
    try:
        ref = _answers(one)
    finally:
        one.stop()
    assert "Paris" in (ref[0][0][0] or "")
    for flags in (["--tensor-parallel-size", "2"], ["--tensor-parallel-size", "2", "--expert-parallel"]):
        s = Server(DEMO, flags, tmp_path / ("par-" + "-".join(flags) + ".log"))
        try:
            assert _answers(s) == ref, flags
        finally:
            s.stop()
        assert "sharding: tensor parallel 2" in s.log_path.read_text()


def test_serve_refuses_an_invalid_layout(tmp_path):
    _need_demo()
    # 4 heads over 3 ranks.
    p = subprocess.run([_latent_bin(), "serve", "--model", str(DEMO), "--port", "0", "--tensor-parallel-size", "3"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "num_attention_heads 4 is not divisible by --tensor-parallel-size 3" in p.stderr + p.stdout
