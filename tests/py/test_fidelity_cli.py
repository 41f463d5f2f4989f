"""`latent fidelity`: identical plans give exactly zero error, KL 0 and full agreement; the founding experiment
(kv_b_proj -> mxfp4) gives non-zero per-layer errors; --plot writes a PNG."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LATENT = os.environ.get("LATENT_BIN", str(ROOT / "build" / "ci" / "latent"))
TINY = ROOT / "tests" / "models" / "glm5-tiny-mxfp4"


def fidelity(*args):
    p = subprocess.run([LATENT, "fidelity", "--model", TINY, "--max-tokens", "8", *map(str, args)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return p


def test_identical_plans_are_identical():
    r = json.loads(fidelity("--json").stdout)
    assert r["baseline_transforms"] == [] and r["candidate_transforms"] == []
    assert len(r["prompts"]) == 4  # no tokenizer: four random prompts
    for p in r["prompts"]:
        assert all(e == 0.0 for e in p["layer_rel_error"])
        assert p["kl_mean"] == 0.0 and p["kl_max"] == 0.0
        assert p["top1_agreement"] == 1.0
        assert p["diverge_step"] is None
        assert p["greedy_baseline"] == p["greedy_candidate"] and len(p["greedy_baseline"]) == 8


def test_kv_b_proj_mxfp4_is_measured(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("# two prompts as ids\nids: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20\n"
                       "ids: 200 100 50 25 12 6 3 1 0 4 8 15 16 23 42\n")
    png = tmp_path / "layers.png"
    r = json.loads(fidelity("--candidate", "*.kv_b_proj=mxfp4", "--prompts", prompts, "--json", "--plot", png).stdout)
    kvb = r["candidate_transforms"]
    assert len(kvb) == 4 and all(0.09 < t["rel_error"] < 0.14 and "kv_b_proj" in t["name"] for t in kvb)
    assert len(r["prompts"]) == 2
    for p in r["prompts"]:
        errs = p["layer_rel_error"]
        assert errs[0] == 0.0  # embeddings are untouched
        assert all(e > 1e-4 for e in errs[1:])  # every layer after the first attention differs
        assert p["kl_mean"] > 0.0 and 0.0 <= p["top1_agreement"] <= 1.0
    assert len(r["mean_layer_rel_error"]) == 5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    table = fidelity("--candidate", "*.kv_b_proj=mxfp4", "--prompts", prompts).stdout
    assert "per-layer relative error" in table and "kv_b_proj" in table


def test_bad_inputs(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("ids: 1 2 x\n")
    for args, needle in [(["--prompts", bad], "bad.txt:1"), (["--candidate", "*.kv_b_proj=int2"], "int2"),
                         (["--prompts", tmp_path / "missing.txt"], "missing.txt"),
                         (["--candidate", "*.nothing=mxfp4"], "matches no Linear weight")]:
        p = subprocess.run([LATENT, "fidelity", "--model", TINY, *map(str, args)], capture_output=True, text=True)
        assert p.returncode == 1 and needle in p.stderr, (args, p.stderr)
