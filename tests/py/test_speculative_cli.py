"""Speculative decoding with the MTP layer, from the command line: `latent run --num-speculative-tokens K` /
`--speculative-config JSON` gives the same tokens as K = 0 (greedy and seeded sampling) on every tiny MTP model,
`latent plan` lists the MTP layer's tensors with their formats only when speculation is on, bad flags and
checkpoints without an MTP layer are one-line errors; and tools/make_tiny_models.py + tools/mtp_reference.py
reproduce the committed MTP models and fixtures (numpy only).

Runs the binary named by $LATENT_BIN (set by ctest)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "models"
GOLDEN = ROOT / "tests" / "golden"
LATENT = os.environ.get("LATENT_BIN", str(ROOT / "build" / "ci" / "latent"))
MTP_MODELS = ["glm5-tiny-mtp", "v3-tiny-mtp", "glm5-tiny-mxfp4-mtp"]
sys.path.insert(0, str(ROOT / "tools"))


def run(*args, check=True):
    p = subprocess.run([LATENT, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check is not None:
        assert (p.returncode == 0) == check, f"exit {p.returncode}\nstdout:{p.stdout[-2000:]}\nstderr:{p.stderr[-2000:]}"
    return p


def ids(p):
    return [int(t) for t in p.stdout.strip().splitlines()[0].split()]


@pytest.mark.parametrize("model", MTP_MODELS)
@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.8", "--seed", "7"]])
def test_run_speculative_equals_plain(model, sampling):
    base = ["run", "--model", MODELS / model, "--prompt-tokens", "5 9 33 2 7 100 3 61 8 250 17", "--max-tokens", "40",
            *sampling]
    plain = ids(run(*base, "--num-speculative-tokens", "0"))
    assert len(plain) == 40
    for k in (1, 2, 3):
        p = run(*base, "--num-speculative-tokens", str(k))
        assert ids(p) == plain, f"k={k}"
        assert f"speculative k={k}" in p.stderr
        q = run(*base, "--speculative-config", json.dumps({"method": "deepseek_mtp", "num_speculative_tokens": k}))
        assert ids(q) == plain
    if not sampling:  # the scheduler path and the plain generation agree on greedy
        assert ids(run(*base)) == plain


def test_plan_lists_the_mtp_layer_only_with_speculation():
    d = MODELS / "glm5-tiny-mxfp4-mtp"
    off = {e["name"]: e for e in json.loads(run("plan", "--model", d, "--json").stdout)}
    on = {e["name"]: e for e in json.loads(run("plan", "--model", d, "--json", "--num-speculative-tokens", "2").stdout)}
    mtp = [n for n in on if n.startswith("model.layers.4.")]
    assert len(mtp) > 40
    for n in mtp:
        assert off[n]["skipped"] and "speculative decoding is off" in off[n]["skip_reason"]
        assert not on[n]["skipped"], n
    assert on["model.layers.4.mlp.experts.0.up_proj.weight"]["stored"] == "mxfp4"
    assert on["model.layers.4.eh_proj.weight"]["stored"] == "bf16"
    assert on["model.layers.4.self_attn.indexer.wk.weight"]["stored"] == "bf16"
    text = run("plan", "--model", d, "--num-speculative-tokens", "1").stdout
    assert "skipped" not in text


@pytest.mark.parametrize("args,msg", [
    (["--model", MODELS / "glm5-tiny", "--num-speculative-tokens", "1"], "has no MTP layer"),
    (["--model", MODELS / "glm5-tiny-mtp", "--speculative-config", "{\"method\": \"eagle\", \"num_speculative_tokens\": 1}"],
     "method \"eagle\" is not supported"),
    (["--model", MODELS / "glm5-tiny-mtp", "--speculative-config", "{\"method\": \"mtp\"}"], "num_speculative_tokens"),
    (["--model", MODELS / "glm5-tiny-mtp", "--speculative-config", "{\"method\": \"mtp\", \"num_speculative_tokens\": 2, \"draft_model\": \"x\"}"],
     "key 'draft_model' is not supported"),
    (["--model", MODELS / "glm5-tiny-mtp", "--speculative-config", "[1]"], "expected a JSON object"),
    (["--model", MODELS / "glm5-tiny-mtp", "--speculative-config", "{\"method\": \"mtp\", \"num_speculative_tokens\": 2}",
      "--num-speculative-tokens", "3"], "disagrees"),
])
def test_bad_speculative_flags_are_one_line_errors(args, msg):
    for cmd in (["plan"], ["run", "--prompt-tokens", "1 2"]):
        p = run(*cmd, *args, check=False)
        assert p.returncode != 0
        assert msg in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_tools_reproduce_the_committed_mtp_models_and_fixtures(tmp_path):
    import make_tiny_models as mt
    import mtp_reference as ref
    import quantize_np as q
    for name, (base, seed, copies) in mt.MTP.items():
        mt.add_mtp_layer(str(MODELS / base), str(tmp_path / name), seed, copies)
        assert (tmp_path / name / "model.safetensors").read_bytes() == (MODELS / name / "model.safetensors").read_bytes()
    q.quantize_dir_mxfp4(str(tmp_path / "glm5-tiny-mtp"), str(tmp_path / "glm5-tiny-mxfp4-mtp"))
    assert ((tmp_path / "glm5-tiny-mxfp4-mtp" / "model.safetensors").read_bytes() ==
            (MODELS / "glm5-tiny-mxfp4-mtp" / "model.safetensors").read_bytes())
    # The main model's tensors are the base model's, byte for byte.
    T, _ = q.load_dir(str(MODELS / "glm5-tiny-mtp"))
    B, _ = q.load_dir(str(MODELS / "glm5-tiny"))
    assert all(T[k].data == v.data for k, v in B.items())
    for name, base in [("glm5-tiny-mtp", "glm5-tiny"), ("v3-tiny-mtp", "v3-tiny"), ("glm5-tiny-mxfp4-mtp", "glm5-tiny-mxfp4")]:
        meta = ref.fixture(str(MODELS / name), str(GOLDEN / base), str(tmp_path / ("g-" + name)))
        got = np.load(tmp_path / ("g-" + name) / "mtp_logits.npy")
        want = np.load(GOLDEN / name / "mtp_logits.npy")
        assert np.abs(got - want).max() < 1e-5
        assert meta["drafts"] == json.loads((GOLDEN / name / "mtp_draft.json").read_text())["drafts"]


@pytest.mark.parametrize("model", MTP_MODELS)
def test_logits_mtp_out_matches_the_reference_fixture(model, tmp_path):
    """`latent logits --mtp-out`: the MTP layer's logits of every slot of the fixture's tokens (the golden prompt and
    the main model's greedy next token) are the numpy reference's (tests/golden/<model>/mtp_logits.npy)."""
    toks = json.loads((GOLDEN / model / "mtp_draft.json").read_text())["tokens"]
    run("logits", "--model", MODELS / model, "--tokens", " ".join(map(str, toks)), "--out", tmp_path / "l.npy",
        "--mtp-out", tmp_path / "m.npy")
    got, want = np.load(tmp_path / "m.npy"), np.load(GOLDEN / model / "mtp_logits.npy")
    assert got.shape == want.shape == (len(toks), 256)
    assert np.abs(got - want).max() <= 2e-4 * max(1.0, np.abs(want).max())
    p = run("logits", "--model", MODELS / "glm5-tiny", "--tokens", "1 2", "--out", tmp_path / "l.npy",
            "--mtp-out", tmp_path / "m.npy", check=False)
    assert p.returncode != 0 and "--mtp-out: the checkpoint has no MTP layer" in p.stderr


def test_demo_check_mtp_script():
    """tools/demo/check_mtp.py (what a trained demo MTP layer must pass) on a tiny MTP model: reference agreement
    of `latent logits --mtp-out` and speculation = no speculation."""
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "demo" / "check_mtp.py"), str(MODELS / "glm5-tiny-mtp"),
                        "--latent", LATENT, "--base", str(MODELS / "glm5-tiny"), "--prompt-tokens", "5 9 33 2 7 100 3",
                        "--max-tokens", "20"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "all checks passed" in p.stdout and "[main tensors] " in p.stdout
    assert p.stdout.count("same tokens as without") == 3


@pytest.mark.parametrize("value", ["0.5", "1", "-2", "abc"])
def test_bad_mixed_step_factor_is_a_one_line_error(value):
    # --mixed-step-factor (serve): 0 turns the bound off, values above 1 set it; anything else is refused before the
    # model loads.
    p = run("serve", "--model", MODELS / "glm5-tiny", "--mixed-step-factor", value, check=False)
    assert p.returncode != 0
    assert "--mixed-step-factor" in p.stderr and "must be 0 (off) or a number above 1" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
