"""`latent fidelity`: identical plans give exactly zero error, KL 0 and full agreement; the founding experiment
(kv_b_proj -> mxfp4) is the default and gives non-zero per-layer errors; --quantize / --max-quant-error /
--allow-lossy mean what they mean for every weight-loading command; --plot writes a readable PNG and its data."""
import json
import os
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
LATENT = os.environ.get("LATENT_BIN", str(ROOT / "build" / "ci" / "latent"))
TINY = ROOT / "tests" / "models" / "glm5-tiny-mxfp4"
FOUNDING = "*.kv_b_proj=mxfp4"


def fidelity(*args, check=True):
    args = [str(a) for a in args]
    if "--max-tokens" not in args:
        args = ["--max-tokens", "8", *args]
    p = subprocess.run([LATENT, "fidelity", "--model", TINY, *args],
                       capture_output=True, text=True, timeout=600)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def fidelity_json(*args):
    p = fidelity("--json", *args)
    return json.loads(p.stdout), p.stderr.splitlines()[0]


def ids_prompts(tmp_path, n=2):
    rows = ["1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20", "200 100 50 25 12 6 3 1 0 4 8 15 16 23 42"]
    rows += [" ".join(str((7 * i + 3 * k) % 250) for k in range(12)) for i in range(max(0, n - 2))]
    f = tmp_path / "p.txt"
    f.write_text("# prompts as ids\n" + "".join(f"ids: {r}\n" for r in rows[:n]))
    return f


def test_identical_plans_are_identical():
    r, first = fidelity_json("--candidate", "none")
    assert first.startswith("fidelity: candidate as stored against baseline as stored") and "determinism" in first
    assert r["comparison"]["founding_default"] is False
    assert r["baseline_transforms"] == [] and r["candidate_transforms"] == []
    assert len(r["prompts"]) == 4  # no tokenizer: four random prompts
    for p in r["prompts"]:
        assert all(e == 0.0 for e in p["layer_rel_error"])
        assert p["kl_mean"] == 0.0 and p["kl_max"] == 0.0
        assert p["top1_agreement"] == 1.0
        assert p["diverge_step"] is None
        assert p["greedy_baseline"] == p["greedy_candidate"] and len(p["greedy_baseline"]) == 8


def test_default_is_the_founding_comparison():
    """No --candidate: *.kv_b_proj=mxfp4 against the checkpoint as stored, said on the first line."""
    table = fidelity("--max-tokens", "2").stdout.splitlines()
    assert table[0].startswith("fidelity: the founding comparison (no --candidate given): candidate " + FOUNDING)
    assert "against baseline as stored" in table[0]
    text = "\n".join(table)
    assert "candidate  4 transformed tensor(s), 4 over --max-quant-error 0.05" in text
    r, first = fidelity_json("--max-tokens", "2")
    assert first == r["comparison"]["line"] and first.startswith("fidelity: the founding comparison")
    assert r["comparison"]["founding_default"] is True and r["comparison"]["candidate"] == FOUNDING
    kvb = r["candidate_transforms"]
    assert len(kvb) == 4 and all("kv_b_proj" in t["name"] and t["over_max_quant_error"] for t in kvb)
    assert r["baseline_transforms"] == []
    assert all(e > 1e-4 for p in r["prompts"] for e in p["layer_rel_error"][1:])
    # --max-quant-error keeps its meaning: the threshold the candidate's tensors are flagged against
    r, _ = fidelity_json("--max-tokens", "0", "--max-quant-error", "0.2")
    assert r["max_quant_error"] == 0.2 and not any(t["over_max_quant_error"] for t in r["candidate_transforms"])


def test_kv_b_proj_mxfp4_is_measured(tmp_path):
    prompts = ids_prompts(tmp_path)
    png = tmp_path / "layers.png"
    r = json.loads(fidelity("--candidate", FOUNDING, "--prompts", prompts, "--json", "--plot", png).stdout)
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
    table = fidelity("--candidate", FOUNDING, "--prompts", prompts).stdout
    assert table.startswith("fidelity: candidate " + FOUNDING + " against baseline as stored\n")
    assert "per-layer relative error" in table and "kv_b_proj" in table


# --- the flags every weight-loading command shares -------------------------------------------------------------

def test_quantize_applies_to_both_plans_under_the_guard():
    # refused like `latent plan --quantize` would be, with the hint that fidelity measures with --candidate
    p = fidelity("--quantize", FOUNDING, "--candidate", "none", check=False)
    assert p.returncode == 1
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("latent: error: refusing lossy transform: 4 tensor(s) exceed --max-quant-error 0.05")
    assert "--allow-lossy" in err and "--candidate" in err
    # --allow-lossy lifts the guard: both plans carry the transform, so they are identical
    r, first = fidelity_json("--quantize", FOUNDING, "--allow-lossy", "--candidate", "none", "--max-tokens", "2")
    assert "both with --quantize " + FOUNDING in first
    assert len(r["baseline_transforms"]) == 4 and len(r["candidate_transforms"]) == 4
    assert all(e == 0.0 for p in r["prompts"] for e in p["layer_rel_error"])
    # --max-quant-error raises the budget instead
    r, _ = fidelity_json("--quantize", FOUNDING, "--max-quant-error", "0.2", "--candidate", "none", "--max-tokens", "0")
    assert len(r["baseline_transforms"]) == 4


def test_quantize_within_budget_plus_candidate():
    r, first = fidelity_json("--quantize", "*.o_proj=fp8_e4m3_tensor", "--max-tokens", "0")
    assert first.startswith("fidelity: the founding comparison") and "both with --quantize *.o_proj=fp8_e4m3_tensor" in first
    base = {t["name"] for t in r["baseline_transforms"]}
    cand = {t["name"] for t in r["candidate_transforms"]}
    assert base and all("o_proj" in n for n in base)
    assert cand == base | {n for n in cand if "kv_b_proj" in n} and len(cand) == len(base) + 4
    # a candidate rule overriding every tensor of a --quantize rule: the candidate wins there, the baseline keeps it
    r, _ = fidelity_json("--quantize", "*.kv_b_proj=fp8_e4m3_block128", "--candidate", FOUNDING, "--max-tokens", "0")
    assert all("fp8_e4m3_block128" in t["transform"] for t in r["baseline_transforms"])
    assert all("mxfp4" in t["transform"] for t in r["candidate_transforms"]) and len(r["candidate_transforms"]) == 4


@pytest.mark.parametrize("cmd", ["plan", "run", "logits", "serve", "fidelity"])
def test_weight_loading_commands_share_the_flags(cmd):
    h = subprocess.run([LATENT, cmd, "--help"], capture_output=True, text=True).stdout
    for flag in ["--model", "--quantize", "--max-quant-error", "--allow-lossy", "--threads"]:
        assert flag in h, (cmd, flag)


def test_bad_inputs(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("ids: 1 2 x\n")
    for args, needle in [(["--prompts", bad], "bad.txt:1"), (["--candidate", "*.kv_b_proj=int2"], "int2"),
                         (["--prompts", tmp_path / "missing.txt"], "missing.txt"),
                         (["--candidate", "*.nothing=mxfp4"], "matches no Linear weight"),
                         (["--candidate", "none", "--candidate", FOUNDING], "--candidate none"),
                         (["--max-quant-error", "-1"], "--max-quant-error"),
                         (["--plot", tmp_path / "x.png", "--plot-scale", "log"], "symlog")]:
        p = subprocess.run([LATENT, "fidelity", "--model", TINY, *map(str, args)], capture_output=True, text=True)
        assert p.returncode == 1 and needle in p.stderr, (args, p.stderr)
    p = subprocess.run([LATENT, "plan", "--model", TINY, "--max-quant-error", "nan"], capture_output=True, text=True)
    assert p.returncode == 1 and "--max-quant-error" in p.stderr


# --- the chart --------------------------------------------------------------------------------------------------

def read_png(path):
    """(width, height, rows of (r, g, b)) of an 8-bit RGB PNG written with filter 0 (what latent writes)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h = 8, b"", None, None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", body[:10])
            assert (depth, color) == (8, 2)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = 3 * w + 1
    rows = []
    for y in range(h):
        line = raw[y * stride:(y + 1) * stride]
        assert line[0] == 0
        rows.append([tuple(line[1 + 3 * x:4 + 3 * x]) for x in range(w)])
    return w, h, rows


def plot(tmp_path, *args, name="c.png"):
    png = tmp_path / name
    r = json.loads(fidelity("--json", "--max-tokens", "0", "--plot", png, *args).stdout)
    return r, png, json.loads(png.with_suffix(".json").read_text())


def test_chart_is_readable(tmp_path):
    r, png, d = plot(tmp_path, "--prompts", ids_prompts(tmp_path))
    w, h, px = read_png(png)
    assert (w, h) == (d["width"], d["height"])
    # title names the model and both plans; axes are labelled
    assert "glm5-tiny-mxfp4" in d["title_lines"][0]
    sub = " ".join(d["subtitle_lines"])
    assert "candidate: " + FOUNDING in sub and "baseline: as stored" in sub
    assert d["x_label"] and d["y_label"].startswith("relative error")
    # a linear axis from 0 that covers every value
    values = [v for s in d["series"] for v in s["y"]]
    assert d["y_scale"] == "linear" and d["y_min"] == 0.0 and 0.0 in d["y_ticks"] and d["y_max"] >= max(values)
    assert d["y_ticks"] == sorted(d["y_ticks"]) and d["y_ticks"][-1] == d["y_max"]
    # full legend: every prompt label (lower case, longer than the old 26-character cut) and the mean
    labels = [p["label"] for p in r["prompts"]]
    assert [s["label"] for s in d["series"]] == labels + ["mean over the 2 prompts"]
    assert all(len(l) > 26 for l in labels)
    for e in d["legend"]:
        assert " ".join(e["lines"]) == e["label"]
        # ink up to where the text should end: the last glyph was drawn
        rows = range(e["y"], e["y"] + 12 * len(e["lines"]))
        dark = [x for y in rows for x in range(d["plot_area"]["left"], w) if sum(px[y][x]) < 400]
        assert dark and e["text_right"] - 7 <= max(dark) < e["text_right"], e
    # the drawn markers are where the data says (the mean, drawn last, is on top)
    mean = d["series"][-1]
    for x, y, v in zip(mean["px"], mean["py"], mean["y"]):
        assert px[y][x] == tuple(mean["color"])
        bottom, top = d["plot_area"]["bottom"], d["plot_area"]["top"]
        assert abs(y - (bottom + (top - bottom) * (v - d["y_min"]) / (d["y_max"] - d["y_min"]))) <= 1


def test_chart_of_zeros_shows_zero(tmp_path):
    _, png, d = plot(tmp_path, "--candidate", "none")
    assert d["note"] == "all values are 0" and d["y_min"] == 0.0 and d["y_max"] > 0
    w, h, px = read_png(png)
    mean = d["series"][-1]
    assert all(y == d["plot_area"]["bottom"] for y in mean["py"])  # zero is the bottom of the axis, and drawn
    assert all(px[y][x] == tuple(mean["color"]) for x, y in zip(mean["px"], mean["py"]))


def test_chart_symlog_and_many_prompts(tmp_path):
    _, png, d = plot(tmp_path, "--plot-scale", "symlog", "--prompts", ids_prompts(tmp_path, 9), name="s.png")
    assert d["y_scale"] == "symlog" and 0.0 in d["y_ticks"] and d["linear_threshold"] > 0
    values = [v for s in d["series"] for v in s["y"] if v]
    assert d["linear_threshold"] <= min(values) and d["y_max"] >= max(values)
    # nine prompts: the spread as a band and the mean, not nine lines
    assert [e["label"] for e in d["legend"]] == ["min..max over the 9 prompts", "mean over the 9 prompts"]
    w, h, _ = read_png(png)
    assert (w, h) == (d["width"], d["height"])


# --- MTP draft acceptance ----------------------------------------------------------------------------------------

MTP_TINY = ROOT / "tests" / "models" / "glm5-tiny-mxfp4-mtp"


def mtp_fidelity(*args, model=MTP_TINY, check=True):
    p = subprocess.run([LATENT, "fidelity", "--model", model, *map(str, args)], capture_output=True, text=True,
                       timeout=600)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_mtp_acceptance_of_both_plans(tmp_path):
    """A checkpoint with an MTP layer: each plan's greedy draft acceptance per position and their difference, with
    the founding candidate (whose rule transforms the MTP layer's kv_b_proj too); position 1 equals the acceptance
    recomputed from the MTP layer's logits along the plan's own continuation (`latent logits --mtp-out`)."""
    n_new = 12
    r = json.loads(mtp_fidelity("--candidate", FOUNDING, "--max-tokens", n_new, "--json").stdout)
    kvb = [t["name"] for t in r["candidate_transforms"]]
    assert len(kvb) == 5 and "model.layers.4.self_attn.kv_b_proj.weight" in kvb
    m = r["mtp"]
    assert m["draft_positions"] == 3 and "own greedy continuation" in m["definition"]
    for side in ("baseline", "candidate"):
        s, key = m[side], "greedy_" + side
        # draft j is proposed at every continuation position whose j-th successor is in the continuation
        want = [sum(max(0, len(p[key]) - j) for p in r["prompts"]) for j in (1, 2, 3)]
        assert s["proposed"] == want and want[0] > 0
        assert all(0 <= a <= q for a, q in zip(s["accepted"], s["proposed"]))
        assert s["accepted"] == sorted(s["accepted"], reverse=True)  # a chain: j accepted needs 1..j-1
        assert s["acceptance"] == [pytest.approx(a / q) for a, q in zip(s["accepted"], s["proposed"])]
        per = [p["mtp_" + side] for p in r["prompts"]]
        assert [sum(x["proposed"][j] for x in per) for j in range(3)] == s["proposed"]
        assert [sum(x["accepted"][j] for x in per) for j in range(3)] == s["accepted"]
    assert m["difference"] == [pytest.approx(c - b) for b, c in zip(m["baseline"]["acceptance"], m["candidate"]["acceptance"])]
    # position 1 from the MTP logits of every slot of prompt + continuation (the candidate's plan too)
    for side, extra in (("baseline", []), ("candidate", ["--quantize", FOUNDING, "--allow-lossy"])):
        acc = 0
        for p in r["prompts"]:
            prompt, cont = p["prompt_tokens"], p["greedy_" + side]
            toks = " ".join(map(str, prompt + cont))
            q = subprocess.run([LATENT, "logits", "--model", MTP_TINY, "--tokens", toks, "--out", tmp_path / "l.npy",
                                "--mtp-out", tmp_path / "m.npy", *extra], capture_output=True, text=True)
            assert q.returncode == 0, q.stderr
            lg = np.load(tmp_path / "m.npy")
            T = len(prompt)
            acc += sum(int(lg[T + i].argmax()) == cont[i + 1] for i in range(len(cont) - 1))
        assert acc == m[side]["accepted"][0], side
    table = mtp_fidelity("--candidate", FOUNDING, "--max-tokens", n_new).stdout
    assert "MTP draft acceptance" in table
    rows = [line.split() for line in table.splitlines() if line.strip()[:2] in ("1 ", "2 ", "3 ") and "pp" in line]
    assert len(rows) == 3 and rows[0][1] == f"{100 * m['baseline']['acceptance'][0]:.1f}%"


def test_mtp_acceptance_flags():
    # the same plan twice: the same drafts, difference 0
    r = json.loads(mtp_fidelity("--candidate", "none", "--max-tokens", 8, "--mtp-drafts", 2, "--json").stdout)
    m = r["mtp"]
    assert m["draft_positions"] == 2 and m["baseline"] == m["candidate"] and m["difference"] == [0.0, 0.0]
    # off, and without an MTP layer: no MTP section (null), and asking for it is a clear error
    r = json.loads(mtp_fidelity("--max-tokens", 4, "--mtp-drafts", 0, "--json").stdout)
    assert r["mtp"] is None and all(p["mtp_baseline"] is None for p in r["prompts"])
    assert "MTP draft acceptance" not in mtp_fidelity("--max-tokens", 4, "--mtp-drafts", 0).stdout
    r = json.loads(mtp_fidelity("--max-tokens", 4, "--json", model=TINY).stdout)
    assert r["mtp"] is None
    p = mtp_fidelity("--mtp-drafts", 2, model=TINY, check=False)
    assert p.returncode == 1 and "the checkpoint has no MTP layer" in p.stderr
    p = mtp_fidelity("--mtp-drafts", 17, check=False)
    assert p.returncode == 1 and "--mtp-drafts must be in [0, 16]" in p.stderr
