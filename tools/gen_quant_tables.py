#!/usr/bin/env python3
"""Dump ml_dtypes' view of the small float formats into tests/data/quant/ml_dtypes_tables.json.

For every 8-bit / 4-bit format: the fp32 value of every code ("decode", fp32 bits as 8 hex digits, "nan" for NaN),
and the code ml_dtypes gives for a few thousand chosen fp32 inputs ("encode": all codes, every midpoint (tie)
between adjacent codes and its fp32 neighbours, values beyond max, fp32 subnormals, Inf/NaN, random values).
bf16 (ml_dtypes.bfloat16) and f16 (numpy.float16) get encode samples only (their decode is checked exhaustively
in C++). e8m0 gets decode plus the encodings of exact powers of two 2^-127..2^127.
ml_dtypes casts are round-to-nearest-even and NOT saturating: the C++ tests compare with Overflow::NonSaturating.

Usage: tools/gen_quant_tables.py [--out PATH]   (default tests/data/quant/ml_dtypes_tables.json)
tests/py/test_quant_tables.py regenerates the tables in memory and checks they equal the committed file.
"""
import argparse
import json
import pathlib
import warnings

import ml_dtypes
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "data" / "quant" / "ml_dtypes_tables.json"

# name in the JSON -> (numpy dtype, code bits). Code bits 16 = encode only.
FORMATS = {
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 8),
    "float8_e5m2": (ml_dtypes.float8_e5m2, 8),
    "float8_e4m3fnuz": (ml_dtypes.float8_e4m3fnuz, 8),
    "float8_e5m2fnuz": (ml_dtypes.float8_e5m2fnuz, 8),
    "float8_e8m0fnu": (ml_dtypes.float8_e8m0fnu, 8),
    "float4_e2m1fn": (ml_dtypes.float4_e2m1fn, 4),
    "bfloat16": (ml_dtypes.bfloat16, 16),
    "float16": (np.float16, 16),
}


def f32_hex(v):
    return "%08x" % int(np.array(v, dtype=np.float32).view(np.uint32))


def decode_codes(dt, bits):
    """fp32 value of every code."""
    if bits == 4:
        # float4_e2m1fn is stored one code per byte (low nibble).
        codes = np.arange(16, dtype=np.uint8)
    else:
        codes = np.arange(1 << bits, dtype=np.uint64).astype(np.uint8 if bits == 8 else np.uint16)
    return codes.view(dt).astype(np.float32)


def to_codes(x, dt, bits):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = np.asarray(x, dtype=np.float32).astype(dt)
    return y.view(np.uint8 if bits <= 8 else np.uint16).astype(np.int64)


def nextafter32(x, d):
    return np.nextafter(np.float32(x), np.float32(d), dtype=np.float32)


def samples_between(mags):
    """mags: sorted distinct finite non-negative fp32 values that are codes of the format."""
    out = []
    for a in mags:
        out += [a, nextafter32(a, np.inf), nextafter32(a, 0)]
    for a, b in zip(mags[:-1], mags[1:]):
        mid = np.float32((np.float64(a) + np.float64(b)) / 2)  # exact: a and b have few mantissa bits
        out += [mid, nextafter32(mid, np.inf), nextafter32(mid, 0)]
    return out


def common_extras(max_finite, rng, n_random):
    m = np.float32(max_finite)
    out = [m * np.float32(1.01), m * 2, np.float32(1e30), np.float32(3.4028235e38), np.float32(np.inf),
           np.float32(1e-45), np.float32(1e-40), np.float32(1.1754942e-38), np.float32(1.1754944e-38),
           np.float32(0.0)]
    # random magnitudes, log-uniform over the format's range and a bit beyond
    lo, hi = np.log2(float(m)) - 40, np.log2(float(m)) + 2
    out += list((2.0 ** rng.uniform(lo, hi, n_random)).astype(np.float32))
    return out


def finalize(xs, with_nan):
    xs = np.array(xs, dtype=np.float32)
    xs = np.concatenate([xs, -xs])
    if with_nan:
        xs = np.concatenate([xs, np.array([np.nan], np.float32), -np.array([np.nan], np.float32)])
    # dedupe by bit pattern, keep a stable order (sorted by bits)
    u = np.unique(xs.view(np.uint32))
    return u.view(np.float32)


def encode_samples(name, dt, bits, rng):
    if name == "float8_e8m0fnu":
        xs = np.array([2.0 ** e for e in range(-127, 128)], dtype=np.float32)
        return xs
    if bits == 16:
        # a few hundred codes spread over the range plus the edges; samples around each and its successor
        n_codes = 0x7F80 if name == "bfloat16" else 0x7C00  # finite positive codes
        picked = set(rng.integers(0, n_codes, 160).tolist())
        picked |= {0, 1, 2, 3, 0x7F, 0x80, 0x81, 0x3FF, 0x400, 0x401, n_codes - 2, n_codes - 1}
        vals = decode_codes(dt, 16)
        mags = sorted({float(vals[c]) for c in picked} | {float(vals[c + 1]) for c in picked if c + 1 < n_codes})
        pairs = []
        for c in sorted(picked):
            if c + 1 < n_codes:
                a, b = vals[c], vals[c + 1]
                mid = np.float32((np.float64(a) + np.float64(b)) / 2)
                pairs += [mid, nextafter32(mid, np.inf), nextafter32(mid, 0)]
        xs = [np.float32(v) for v in mags] + pairs + common_extras(float(vals[n_codes - 1]), rng, 100)
        return finalize(xs, with_nan=True)
    vals = decode_codes(dt, bits)
    finite = vals[np.isfinite(vals)]
    mags = sorted({np.float32(abs(v)) for v in finite})
    xs = samples_between(mags)
    xs += common_extras(float(mags[-1]), rng, 150)
    # beyond max: the overflow midpoint (next binade step / 2 above max) and its neighbours
    top, below = mags[-1], mags[-2]
    over_mid = np.float32(np.float64(top) + (np.float64(top) - np.float64(below)) / 2)
    xs += [over_mid, nextafter32(over_mid, np.inf), nextafter32(over_mid, 0)]
    # below the smallest subnormal: half of it (tie to 0) and neighbours
    tiny = np.float32(mags[1] / 2)
    xs += [tiny, nextafter32(tiny, np.inf), nextafter32(tiny, 0), np.float32(mags[1] / 4)]
    return finalize(xs, with_nan=(bits != 4))


def build_tables():
    with np.errstate(over="ignore", invalid="ignore"):
        return _build_tables()


def _build_tables():
    rng = np.random.default_rng(20240531)
    formats = {}
    for name, (dt, bits) in FORMATS.items():
        entry = {"code_bits": bits}
        if bits <= 8:
            vals = decode_codes(dt, bits)
            entry["decode"] = ["nan" if np.isnan(v) else f32_hex(v) for v in vals]
        xs = encode_samples(name, dt, bits, rng)
        entry["encode_inputs"] = [f32_hex(v) for v in xs]
        entry["encode_codes"] = [int(c) for c in to_codes(xs, dt, bits)]
        formats[name] = entry
    return {
        "generator": "tools/gen_quant_tables.py",
        "note": "ml_dtypes casts: round to nearest even, non-saturating. fp32 values as hex bits.",
        "ml_dtypes_version": ml_dtypes.__version__,
        "numpy_version": np.__version__,
        "formats": formats,
    }


def render(tables):
    """Deterministic JSON text: objects indented, each list on one line."""
    lines = ["{"]
    top = list(tables.items())
    for i, (k, v) in enumerate(top):
        end = "," if i + 1 < len(top) else ""
        if k != "formats":
            lines.append("  %s: %s%s" % (json.dumps(k), json.dumps(v), end))
            continue
        lines.append('  "formats": {')
        fmts = list(v.items())
        for j, (name, entry) in enumerate(fmts):
            lines.append("    %s: {" % json.dumps(name))
            items = list(entry.items())
            for t, (ek, ev) in enumerate(items):
                lines.append("      %s: %s%s" % (json.dumps(ek), json.dumps(ev, separators=(",", ":")),
                                                 "," if t + 1 < len(items) else ""))
            lines.append("    }" + ("," if j + 1 < len(fmts) else ""))
        lines.append("  }" + end)
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    text = render(build_tables())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("wrote %s (%d bytes)" % (args.out, len(text)))


if __name__ == "__main__":
    main()
