"""The committed ml_dtypes tables (tests/data/quant/ml_dtypes_tables.json) are what tools/gen_quant_tables.py
produces with the installed ml_dtypes: regenerate them in memory and compare."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLES = ROOT / "tests" / "data" / "quant" / "ml_dtypes_tables.json"


def load_generator():
    pytest.importorskip("ml_dtypes")
    spec = importlib.util.spec_from_file_location("gen_quant_tables", ROOT / "tools" / "gen_quant_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_tables_match_ml_dtypes():
    gen = load_generator()
    fresh = gen.build_tables()
    committed = json.loads(TABLES.read_text())
    assert sorted(committed["formats"]) == sorted(fresh["formats"])
    for name, entry in fresh["formats"].items():
        old = committed["formats"][name]
        assert old.keys() == entry.keys(), name
        for key in entry:
            assert old[key] == entry[key], "%s.%s differs from ml_dtypes %s" % (name, key, fresh["ml_dtypes_version"])


def test_committed_text_is_canonical():
    gen = load_generator()
    fresh = gen.build_tables()
    committed = json.loads(TABLES.read_text())
    # version strings may differ between machines; everything else must render byte-identically
    fresh["ml_dtypes_version"] = committed["ml_dtypes_version"]
    fresh["numpy_version"] = committed["numpy_version"]
    assert gen.render(fresh) == TABLES.read_text()


def test_every_format_present_and_sized():
    committed = json.loads(TABLES.read_text())
    f = committed["formats"]
    for name in ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]:
        assert len(f[name]["decode"]) == 256
    assert len(f["float4_e2m1fn"]["decode"]) == 16
    assert TABLES.stat().st_size < 300_000
    for name, entry in f.items():
        assert len(entry["encode_inputs"]) == len(entry["encode_codes"]) > 200, name
