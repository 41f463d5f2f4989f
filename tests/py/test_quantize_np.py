"""tools/quantize_np.py against the reference vectors of docs/quantization.md §vectors
(and cross-checks against ml_dtypes). Needs numpy + ml_dtypes only."""
import os
import sys
import tempfile

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import quantize_np as q  # noqa: E402


# ---------------------------------------------------------------- E2M1 (docs/quantization.md §E2M1)
E2M1_CASES = [  # value, rne, ties-away, toward-zero (llama.cpp)
    (0.3, 1, 1, 1), (-0.7, 9, 9, 9), (1.1, 2, 2, 2), (1.25, 2, 3, 2), (-2.6, 0xD, 0xD, 0xD),
    (3.5, 6, 6, 5), (5.0, 6, 7, 6), (6.2, 7, 7, 7), (100.0, 7, 7, 7), (-0.25, 0, 9, 0),
    (0.75, 2, 2, 1), (1.75, 4, 4, 3), (2.5, 4, 5, 4), (-5.0, 0xE, 0xF, 0xE), (-0.1, 0, 0, 0),
]


@pytest.mark.parametrize("x,rne,away,zero", E2M1_CASES)
def test_e2m1_encode_vectors(x, rne, away, zero):
    assert int(q.e2m1_encode(np.float32(x), "rne")) == rne
    assert int(q.e2m1_encode(np.float32(x), "away")) == away
    assert int(q.e2m1_encode(np.float32(x), "zero")) == zero


def test_e2m1_table_roundtrip():
    vals = q.e2m1_decode(np.arange(16))
    assert list(vals[:8]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert list(vals[8:]) == [-0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    codes = q.e2m1_encode(vals)
    assert list(codes) == list(range(8)) + [0] + list(range(9, 16))  # -0 encodes as 0x0


def test_e2m1_rne_is_nearest():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, 20000)
    c = q.e2m1_encode(x)
    err = np.abs(q.e2m1_decode(c) - np.clip(x, -6, 6))
    best = np.abs(q.E2M1_VALUES[None, :].astype(np.float64) - np.clip(x, -6, 6)[:, None]).min(1)
    assert np.all(err <= best + 1e-12)


# ---------------------------------------------------------------- E8M0 (docs/quantization.md §E8M0)
def test_e8m0_decode_vectors():
    d = q.e8m0_decode(np.array([0x00, 0x01, 0x7A, 0x7E, 0x7F, 0x80, 0x85, 0xFE, 0xFF], np.uint8))
    assert d[0].view(np.uint32) == 0x00400000
    assert d[1] == 2.0 ** -126
    assert list(d[2:7]) == [0.03125, 0.5, 1.0, 2.0, 64.0]
    assert d[7].view(np.uint32) == 0x7F000000
    assert np.isnan(d[8])


@pytest.mark.parametrize("amax,floor,even,ceil", [
    (6.2, 0x7F, 0x7F, 0x80), (7.5, 0x7F, 0x80, 0x80), (0.04, 0x78, 0x78, 0x78), (4.0, 0x7F, 0x7F, 0x7F),
    (0.0, 0x00, 0x00, 0x00)])
def test_e8m0_scale_rules(amax, floor, even, ceil):
    assert int(q.e8m0_scale_code(np.float32(amax), "floor")) == floor
    assert int(q.e8m0_scale_code(np.float32(amax), "even")) == even
    assert int(q.e8m0_scale_code(np.float32(amax), "ceil")) == ceil


def test_mxfp4_small_block_elements():
    w = np.zeros((1, 32), np.float32)
    w[0, :4] = [0.04, -0.011, 0.02, 0.0078125]
    packed, sc = q.mxfp4_quantize(w, "floor")
    assert sc[0, 0] == 0x78
    codes = q.mxfp4_unpack(packed)[0, :4]
    assert list(codes) == [7, 0xB, 5, 2]
    deq = q.mxfp4_dequantize(packed, sc)[0, :4]
    assert list(deq) == [0.046875, -0.01171875, 0.0234375, 0.0078125]


# ---------------------------------------------------------------- full MXFP4 block (docs/quantization.md §vectors)
BLOCK = ((np.arange(32) - 16) / 4).astype(np.float32)[None, :]


@pytest.mark.parametrize("rule", ["floor", "even", "ceil"])
def test_mxfp4_full_block_rne(rule):
    packed, sc = q.mxfp4_quantize(BLOCK, rule)
    assert sc.tolist() == [[0x7F]]
    codes = q.mxfp4_unpack(packed)[0]
    want = [0xE, 0xE, 0xE, 0xD, 0xD, 0xD, 0xC, 0xC, 0xC, 0xC, 0xB, 0xA, 0xA, 0xA, 0x9, 0x0,
            0x0, 0x0, 0x1, 0x2, 0x2, 0x2, 0x3, 0x4, 0x4, 0x4, 0x4, 0x5, 0x5, 0x5, 0x6, 0x6]
    assert list(codes) == want
    assert bytes(packed[0]).hex(" ").upper() == "EE DE DD CC CC AB AA 09 00 21 22 43 44 54 55 66"


def test_mxfp4_full_block_ties_away_packing():
    packed, _ = q.mxfp4_quantize(BLOCK, "floor", mode="away")
    assert bytes(packed[0]).hex(" ").upper() == "EE DE DD CD CC BB AA 99 10 21 32 43 44 55 55 66"


def test_mxfp4_saturation_and_shapes():
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.1, (8, 96)).astype(np.float32)
    w[3, 5] = 7.5 * 2.0 ** -3  # block amax/2^se = 7.5 -> saturates to 6 with floor rule
    w[3, :32] = np.clip(w[3, :32], -0.5, 0.5)
    w[3, 5] = 0.9375
    packed, sc = q.mxfp4_quantize(w, "floor")
    assert packed.shape == (8, 48) and sc.shape == (8, 3)
    deq = q.mxfp4_dequantize(packed, sc)
    assert deq[3, 5] == 0.75  # 0.9375 = 7.5 * 2^-3 -> 6 * 2^-3
    rel = np.linalg.norm(deq - w) / np.linalg.norm(w)
    assert 0.05 < rel < 0.2


# ---------------------------------------------------------------- E4M3FN (docs/quantization.md §FP8)
E4M3_CASES = [(1.0, 0x38), (0.5, 0x30), (2.0, 0x40), (-2.0, 0xC0), (-1.5, 0xBC), (240.0, 0x77),
              (256.0, 0x78), (448.0, 0x7E), (0.1, 0x1D), (0.3, 0x2A), (np.pi, 0x45), (1.0625, 0x38),
              (1.1875, 0x3A), (2.0 ** -6, 0x08), (2.0 ** -9, 0x01), (2.0 ** -10, 0x00),
              (0.75 * 2.0 ** -9, 0x01), (-0.0, 0x80), (500.0, 0x7E)]


@pytest.mark.parametrize("x,code", E4M3_CASES)
def test_e4m3_encode_vectors(x, code):
    assert int(q.e4m3_encode(np.float32(x))) == code


def test_e4m3_nonsaturating_and_decode():
    assert int(q.e4m3_encode(np.float32(500.0), saturate=False)) == 0x7F
    assert int(q.e4m3_encode(np.float32(464.0), saturate=False)) == 0x7E
    assert q.e4m3_decode(np.uint8(0x1D)) == np.float32(0.1015625)
    assert q.e4m3_decode(np.uint8(0x2A)) == np.float32(0.3125)
    assert q.e4m3_decode(np.uint8(0x45)) == np.float32(3.25)
    assert np.isnan(q.e4m3_decode(np.uint8(0x7F))) and np.isnan(q.e4m3_decode(np.uint8(0xFF)))


def test_e4m3_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(0, 50, 50000), rng.normal(0, 0.01, 50000),
                        q.E4M3_TABLE[np.isfinite(q.E4M3_TABLE)],
                        (q.E4M3_TABLE[:0x7E] + q.E4M3_TABLE[1:0x7F]) / 2]).astype(np.float32)
    x = np.clip(x, -448, 448)
    ours = q.e4m3_encode(x)
    ref = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(ours, ref)
    table = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(q.E4M3_TABLE, table, equal_nan=True)


def test_fp8_block_ragged():
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.05, (192, 160)).astype(np.float32)
    codes, sinv = q.fp8_block_quantize(w)
    assert codes.shape == (192, 160) and sinv.shape == (2, 2) and sinv.dtype == np.float32
    assert sinv[1, 1] == np.float32(np.abs(w[128:, 128:]).max()) / np.float32(448)
    deq = q.fp8_block_dequantize(codes, sinv)
    rel = np.linalg.norm(deq - w) / np.linalg.norm(w)
    assert 0.01 < rel < 0.04
    # code 0x38 in block (1,1) with scale_inv 0.0025 -> 0.0025 (docs/quantization.md §vectors)
    c2 = codes.copy(); c2[130, 140] = 0x38
    s2 = sinv.copy(); s2[1, 1] = 0.0025
    assert q.fp8_block_dequantize(c2, s2)[130, 140] == np.float32(0.0025)


def test_bf16_helpers_match_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, 10000).astype(np.float32)
    assert np.array_equal(q.f32_to_bf16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_safetensors_roundtrip_deterministic():
    rng = np.random.default_rng(5)
    T = {"b.weight": q.from_np(rng.normal(size=(4, 32)).astype(np.float32), "BF16"),
         "a.weight": q.from_np(rng.integers(0, 255, (4, 16)).astype(np.uint8), "F8_E4M3"),
         "c": q.from_np(np.arange(5, dtype=np.float32), "F32")}
    with tempfile.TemporaryDirectory() as d:
        p1, p2 = os.path.join(d, "1.safetensors"), os.path.join(d, "2.safetensors")
        q.write_safetensors(p1, T, {"format": "pt"})
        R, meta = q.read_safetensors(p1)
        q.write_safetensors(p2, R, meta)
        assert open(p1, "rb").read() == open(p2, "rb").read()
        assert meta == {"format": "pt"} and R["c"].f32().tolist() == [0, 1, 2, 3, 4]
        try:
            from safetensors.numpy import load_file
        except ImportError:
            return
        p3 = os.path.join(d, "3.safetensors")  # safetensors.numpy cannot read F8 without torch
        q.write_safetensors(p3, {"c": T["c"], "d": q.from_np(np.arange(6, dtype=np.uint8).reshape(2, 3), "U8")},
                            {"format": "pt"})
        L = load_file(p3)
        assert L["c"].tolist() == [0, 1, 2, 3, 4] and L["d"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_quark_exclude_matching():
    ex = q.MXFP4_EXCLUDE
    assert q.quark_excluded("lm_head", ex)
    assert q.quark_excluded("model.layers.3.mlp.gate", ex)
    assert not q.quark_excluded("model.layers.3.mlp.gate_proj", ex)
    assert q.quark_excluded("model.layers.0.mlp.gate_proj", ex)
    assert q.quark_excluded("model.layers.1.mlp.shared_experts.up_proj", ex)
    assert q.quark_excluded("model.layers.2.self_attn.indexer.wk", ex)
    assert not q.quark_excluded("model.layers.1.mlp.experts.7.down_proj", ex)
    assert not q.quark_excluded("model.layers.10.mlp.experts.0.up_proj", ex)


MODELS = os.path.join(ROOT, "tests", "models")


@pytest.mark.parametrize("name,src,kind", [("glm5-tiny-mxfp4", "glm5-tiny", "mxfp4"), ("v3-tiny-fp8", "v3-tiny", "fp8")])
def test_committed_quantized_models_reproduce(name, src, kind):
    """Re-running quantize_np on the committed bf16 model gives the committed quantized files byte for byte."""
    if not os.path.isdir(os.path.join(MODELS, name)):
        pytest.skip("model not present")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, name)
        if kind == "mxfp4":
            q.quantize_dir_mxfp4(os.path.join(MODELS, src), out)
        else:
            q.quantize_dir_fp8(os.path.join(MODELS, src), out)
        for f in ("model.safetensors", "config.json"):
            a = open(os.path.join(out, f), "rb").read()
            b = open(os.path.join(MODELS, name, f), "rb").read()
            assert a == b, f
