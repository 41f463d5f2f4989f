"""`--activations declared` end to end (docs/quantization.md §declared-activations): the plan shows each Linear
module's activation scheme and where it comes from, in text and JSON; fidelity measures the declared route against
the exact one; bad values are one-line errors.

Runs the binary named by $LATENT_BIN (set by ctest)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "models"
LATENT = os.environ.get("LATENT_BIN", str(ROOT / "build" / "ci" / "latent"))
FP8 = MODELS / "v3-tiny-fp8"


def run(*args, check=None):
    p = subprocess.run([LATENT, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check is not None:
        assert (p.returncode == 0) == check, f"exit {p.returncode}\nstdout:{p.stdout[-2000:]}\nstderr:{p.stderr[-2000:]}"
    return p


def plan_json(*extra):
    return {e["name"]: e for e in json.loads(run("plan", "--model", FP8, "--json", *extra, check=True).stdout)}


def test_plan_json_per_module():
    default = plan_json()
    declared = plan_json("--activations", "declared")
    q_a = "model.layers.0.self_attn.q_a_proj.weight"
    kv_b = "model.layers.0.self_attn.kv_b_proj.weight"
    head = "lm_head.weight"
    # Without the flag: fp32 (the CPU default), above the declared scheme, which the plan names with its source.
    a = default[q_a]["activations"]
    assert a["runs"] == "fp32" and a["source"] == "run default"
    assert a["declared"] == "fp8 dynamic 1x128" and a["declared_by"] == "quantization_config.activation_scheme"
    assert a["declared_runnable"] is True
    assert "--activations declared runs it" in a["label"]
    # With it: the FP8 linears run the declared scheme; kv_b_proj (absorbed) and the bf16 head do not.
    a = declared[q_a]["activations"]
    assert a["runs"] == "fp8 dynamic 1x128" and a["source"] == "checkpoint (--activations declared)"
    b = declared[kv_b]["activations"]
    assert b["runs"] == "fp32" and b["declared_runnable"] is False and "absorbed" in b["note"]
    h = declared[head]["activations"]
    assert h["runs"] == "fp32" and h["declared"] is None
    runs = [e["activations"]["runs"] for e in declared.values() if "activations" in e]
    assert runs.count("fp8 dynamic 1x128") == 100  # 4 layers x 4 attention + 3 dense + 3 layers x (8+1) x 3
    # Non-Linear tensors carry no activations entry.
    assert "activations" not in declared["model.norm.weight"]


def test_plan_text_says_where_it_comes_from():
    out = run("plan", "--model", FP8, "--activations", "declared", check=True).stdout
    assert "activations per Linear module" in out
    line = next(l for l in out.splitlines() if "q_a_proj" in l and "declares it" in l)
    assert "fp8 dynamic 1x128 (checkpoint declares it: quantization_config.activation_scheme" in line
    line = next(l for l in out.splitlines() if "kv_b_proj" in l and "run default" in l)
    assert "above the declared fp8 dynamic 1x128" in line
    assert "activations: declared (--activations declared)" in out
    out = run("plan", "--model", FP8, "--device", "cpu", check=True).stdout
    line = next(l for l in out.splitlines() if "o_proj" in l and "run default" in l)
    assert "fp32 (run default, above the declared fp8 dynamic 1x128" in line


def test_checkpoint_declaring_nothing(tmp_path):
    p = run("plan", "--model", MODELS / "v3-tiny", "--activations", "declared", check=True)
    assert "no module runs declared FP8 activations" in p.stderr
    assert "declares it" not in p.stdout
    # Logits are the same bits with and without the flag.
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    run("logits", "--model", MODELS / "v3-tiny", "--tokens", "1,2,3,4", "--out", a, check=True)
    run("logits", "--model", MODELS / "v3-tiny", "--tokens", "1,2,3,4", "--activations", "declared", "--out", b,
        check=True)
    assert a.read_bytes() == b.read_bytes()


def test_logits_change_on_fp8_model(tmp_path):
    np = pytest.importorskip("numpy")
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    run("logits", "--model", FP8, "--tokens", "5,17,200,3,99,42,7", "--out", a, check=True)
    run("logits", "--model", FP8, "--tokens", "5,17,200,3,99,42,7", "--activations", "declared", "--out", b,
        check=True)
    x, y = np.load(a), np.load(b)
    err = np.linalg.norm(y - x) / np.linalg.norm(x)
    assert 0.02 < err < 0.6, err  # tests/model/test_act_declared.cpp explains the band


def test_fidelity_candidate_activations():
    p = run("fidelity", "--model", FP8, "--candidate-activations", "declared", "--mtp-drafts", "0", "--json",
            "--max-tokens", "4", check=True)
    j = json.loads(p.stdout)
    assert "candidate as stored with --activations declared against baseline as stored" in p.stderr
    assert j["activations"]["candidate_declared_linears"] == 100
    assert j["activations"]["baseline_declared_linears"] == 0
    errs = j["mean_layer_rel_error"]
    assert errs[0] == 0 and 0.01 < errs[1] < 0.3 and errs[-1] > errs[1]


@pytest.mark.parametrize("cmd", [["plan"], ["logits", "--tokens", "1,2", "--out", "/dev/null"],
                                 ["run", "--prompt-tokens", "1,2", "--max-tokens", "1"]])
def test_bad_value(cmd):
    p = run(*cmd, "--model", FP8, "--activations", "fp8", check=False)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "--activations must be fp32, bf16 or declared (got 'fp8')" in err[0]


def test_fidelity_bad_value():
    p = run("fidelity", "--model", FP8, "--candidate-activations", "int8", check=False)
    assert p.returncode != 0
    assert "--candidate-activations must be fp32, bf16 or declared (got 'int8')" in p.stderr
