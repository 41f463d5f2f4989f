#!/usr/bin/env python3
"""Our own numpy quantizer / dequantizer for the formats of docs/quantization.md.

No torch needed: numpy only (ml_dtypes is optional and only used by the tests for cross-checks).
Safetensors files are read and written by a tiny built-in codec, so F8_E4M3 / U8 / BF16 tensors
are handled as raw bytes, unchanged tensors are copied byte for byte, and output is deterministic
(tensors sorted by name, header padded with spaces to a multiple of 8).

Formats (docs/quantization.md §E2M1, §E8M0, §MXFP4, §FP8):
  * FP4 E2M1 encode: round to nearest, ties to even code (RNE), saturate |x| >= 6 to +-6; a value
    that rounds to magnitude 0 gets code 0x0 (never 0x8). Also 'away' (ties away from zero) and
    'zero' (ties toward zero, llama.cpp) for the docs/quantization.md §vectors.
  * E8M0 shared scale per 32 contiguous inputs; rules 'floor' (OCP: floor(log2 amax) - 2),
    'even' (Quark default), 'ceil' (ceil(log2(amax/6))). All-zero block -> code 0x00.
  * MXFP4 Quark/OCP packing: byte k of a row = code(2k) | code(2k+1) << 4.
  * FP8 E4M3FN encode: RNE on the 3-bit mantissa, saturating to +-448 by default.
  * DeepSeek block FP8: 128x128 blocks, scale_inv = float32(amax) / 448 (fp32 division),
    codes = e4m3(float32(W) / scale_inv) (fp32 division), dequant = float32(e4m3) * scale_inv (fp32).

CLI:
  quantize_np.py mxfp4 SRC_DIR DST_DIR [--scale-rule floor]   # Quark MXFP4 routed experts
  quantize_np.py fp8   SRC_DIR DST_DIR                        # DeepSeek block FP8
  quantize_np.py dequant SRC_DIR DST_DIR [--dtype F32|BF16]   # unquantized copy (for references)
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

import numpy as np

# ----------------------------------------------------------------------------------------------
# FP4 E2M1
# ----------------------------------------------------------------------------------------------
E2M1_MAG = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)
E2M1_MID = (E2M1_MAG[:-1] + E2M1_MAG[1:]) / 2  # 0.25 0.75 1.25 1.75 2.5 3.5 5
E2M1_VALUES = np.concatenate([E2M1_MAG, -E2M1_MAG]).astype(np.float32)  # code -> value


def e2m1_encode(x, mode="rne"):
    """x: array (already divided by the block scale). Returns uint8 codes 0..15."""
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("e2m1_encode: non-finite input")
    m = np.abs(x)
    if mode == "rne":
        c = np.searchsorted(E2M1_MID, m, side="left")  # ties -> lower code
        tie = np.isin(m, E2M1_MID)
        c = np.where(tie & (c % 2 == 1), c + 1, c)      # ties -> even code
    elif mode == "away":
        c = np.searchsorted(E2M1_MID, m, side="right")  # ties -> larger magnitude
    elif mode == "zero":
        c = np.searchsorted(E2M1_MID, m, side="left")   # ties -> smaller magnitude
    else:
        raise ValueError(mode)
    c = c.astype(np.uint8)
    neg = (x < 0) & (c != 0)
    return np.where(neg, c | 8, c).astype(np.uint8)


def e2m1_decode(codes):
    return E2M1_VALUES[np.asarray(codes, dtype=np.uint8) & 15]


# ----------------------------------------------------------------------------------------------
# E8M0
# ----------------------------------------------------------------------------------------------
def _floor_log2(a):
    """exact floor(log2(a)) for a > 0 (float64)."""
    _, e = np.frexp(a)  # a = f * 2^e, f in [0.5, 1)
    return e.astype(np.int64) - 1


def e8m0_scale_code(amax, rule="floor"):
    """Shared-scale code (uint8) for blocks with max |x| = amax (fp32 values), E2M1 elements."""
    a = np.asarray(amax, dtype=np.float32).astype(np.float64)
    pos = a > 0
    safe = np.where(pos, a, 1.0)
    if rule == "floor":
        se = _floor_log2(safe) - 2
    elif rule == "even":
        bits = safe.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0x200000) & 0xFF800000
        se = _floor_log2(bits.astype(np.uint32).view(np.float32).astype(np.float64)) - 2
    elif rule == "ceil":
        r = safe / 6.0
        f, e = np.frexp(r)
        se = np.where(f == 0.5, e - 1, e).astype(np.int64)
    else:
        raise ValueError(rule)
    se = np.clip(se, -127, 127)
    return np.where(pos, se + 127, 0).astype(np.uint8)


def e8m0_decode(codes):
    c = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    v = np.ldexp(np.ones(c.shape, dtype=np.float64), np.minimum(c, 254) - 127).astype(np.float32)
    return np.where(c == 255, np.float32(np.nan), v).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# MXFP4 (per 32 contiguous inputs, Quark/OCP packing)
# ----------------------------------------------------------------------------------------------
def mxfp4_quantize(w, rule="floor", mode="rne"):
    """w: [out, in] float (fp32/bf16 values). Returns (packed uint8 [out, in/2], scales uint8 [out, in/32])."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % 32:
        raise ValueError(f"mxfp4_quantize: need [out, in] with in % 32 == 0, got {w.shape}")
    out, n = w.shape
    blk = w.reshape(out, n // 32, 32).astype(np.float64)
    amax = np.abs(blk).max(-1)
    sc = e8m0_scale_code(amax.astype(np.float32), rule)
    se = sc.astype(np.int64) - 127
    codes = e2m1_encode(np.ldexp(blk, -se[..., None]), mode).reshape(out, n)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, sc


def mxfp4_unpack(packed):
    p = np.asarray(packed, dtype=np.uint8)
    codes = np.empty((p.shape[0], p.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = p & 15
    codes[:, 1::2] = p >> 4
    return codes


def mxfp4_dequantize(packed, scales):
    codes = mxfp4_unpack(packed)
    vals = e2m1_decode(codes).astype(np.float32)
    s = np.repeat(e8m0_decode(scales), 32, axis=1)
    return (vals * s).astype(np.float32)  # exact (power-of-two scale)


# ----------------------------------------------------------------------------------------------
# FP8 E4M3FN
# ----------------------------------------------------------------------------------------------
def e4m3_encode(x, saturate=True):
    """RNE to E4M3FN (fp32/fp64 input, evaluated exactly). Returns uint8 codes."""
    x = np.asarray(x, dtype=np.float64)
    sign = np.signbit(x).astype(np.uint8) << 7
    m = np.abs(x)
    nan = np.isnan(m)
    m = np.where(nan, 0.0, m)
    if saturate:
        m = np.minimum(m, 448.0)
    sub = m < 2.0 ** -6
    # subnormal / zero: multiples of 2^-9 (code 8 = 2^-6 is the smallest normal, same formula)
    q_sub = np.rint(m * 512.0)
    e = _floor_log2(np.where(sub, 1.0, m))
    mant = np.rint((np.ldexp(np.where(sub, 1.0, m), -e) - 1.0) * 8.0)
    carry = mant == 8
    e = np.where(carry, e + 1, e)
    mant = np.where(carry, 0, mant)
    code_norm = ((e + 7) << 3) + mant.astype(np.int64)
    code = np.where(sub, q_sub.astype(np.int64), code_norm)
    code = np.where(code > 0x7E, 0x7F, code)  # only reachable when not saturating -> NaN
    code = np.where(nan, 0x7F, code)
    return (code.astype(np.uint8) | sign).astype(np.uint8)


def _e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e = (c >> 3) & 15
        mm = c & 7
        if e == 15 and mm == 7:
            t[c] = np.nan
        elif e == 0:
            t[c] = s * mm * 2.0 ** -9
        else:
            t[c] = s * 2.0 ** (e - 7) * (1 + mm / 8)
    return t


E4M3_TABLE = _e4m3_table()


def e4m3_decode(codes):
    return E4M3_TABLE[np.asarray(codes, dtype=np.uint8)]


def fp8_block_quantize(w, block=128):
    """DeepSeek block FP8. w [out, in] -> (codes uint8 [out, in], scale_inv float32 [ceil(out/b), ceil(in/b)])."""
    w = np.asarray(w, dtype=np.float32)
    out, n = w.shape
    ro, rc = -(-out // block), -(-n // block)
    codes = np.zeros((out, n), dtype=np.uint8)
    sinv = np.zeros((ro, rc), dtype=np.float32)
    for i in range(ro):
        for j in range(rc):
            b = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            amax = np.float32(np.abs(b).max())
            s = np.float32(amax / np.float32(448.0)) if amax > 0 else np.float32(1.0)
            sinv[i, j] = s
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = e4m3_encode((b / s).astype(np.float32))
    return codes, sinv


def fp8_block_dequantize(codes, scale_inv, block=128):
    v = e4m3_decode(codes)
    s = np.repeat(np.repeat(np.asarray(scale_inv, np.float32), block, 0), block, 1)[: v.shape[0], : v.shape[1]]
    return (v * s).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# bf16 helpers (no ml_dtypes needed)
# ----------------------------------------------------------------------------------------------
def bf16_bits_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """RNE fp32 -> bf16 bits (NaN kept quiet)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), r).astype(np.uint16)


# ----------------------------------------------------------------------------------------------
# minimal safetensors codec
# ----------------------------------------------------------------------------------------------
ST_NP = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
         "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
         "BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8}


class Tensor:
    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, list(shape), bytes(data)

    def raw(self):
        """numpy view of the stored bits (BF16 -> uint16, F8 -> uint8)."""
        return np.frombuffer(self.data, dtype=np.dtype(ST_NP[self.dtype]).newbyteorder("<")).reshape(self.shape)

    def f32(self):
        if self.dtype == "BF16":
            return bf16_bits_to_f32(self.raw())
        if self.dtype in ("F32", "F16", "F64"):
            return self.raw().astype(np.float32)
        raise TypeError(f"f32(): dtype {self.dtype}")


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    hdr = json.loads(buf[8:8 + n].decode("utf-8"))
    meta = hdr.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        out[k] = Tensor(v["dtype"], v["shape"], buf[base + a: base + b])
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    names = sorted(tensors)
    hdr, off = {}, 0
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for k in names:
        t = tensors[k]
        hdr[k] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + len(t.data)]}
        off += len(t.data)
    h = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for k in names:
            f.write(tensors[k].data)


def from_np(arr, dtype):
    a = np.ascontiguousarray(arr)
    if dtype == "BF16":
        a = a.astype(np.uint16) if a.dtype == np.uint16 else f32_to_bf16_bits(a)
    else:
        a = a.astype(np.dtype(ST_NP[dtype]).newbyteorder("<"))
    return Tensor(dtype, a.shape, a.tobytes())


def load_dir(d):
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    T, meta = {}, None
    for f in files:
        t, meta = read_safetensors(os.path.join(d, f))
        T.update(t)
    return T, meta


def _copy_side_files(src, dst):
    os.makedirs(dst, exist_ok=True)
    for f in sorted(os.listdir(src)):
        if f.endswith(".json") and f not in ("config.json", "model.safetensors.index.json"):
            shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
    with open(os.path.join(src, "config.json")) as f:
        return json.load(f)


def _write_config(dst, cfg):
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


# ----------------------------------------------------------------------------------------------
# checkpoint converters
# ----------------------------------------------------------------------------------------------
MXFP4_EXCLUDE = ["lm_head", "re:.*mlp.gate$", "re:.*self_attn.*", "re:.*shared_experts.*", "re:model.layers.0.*"]
EXPERT_RE = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)$")


def quark_excluded(module, exclude):
    for e in exclude:
        if e.startswith("re:"):
            if re.match(e[3:], module):
                return True
        elif e == module:
            return True
    return False


def quark_mxfp4_config(rule):
    spec = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
            "scale_format": "e8m0", "scale_type": "float", "scale_calculation_mode": rule,
            "round_method": "half_even", "is_dynamic": False, "observer_cls": "PerBlockMXObserver",
            "mx_element_dtype": None, "symmetric": None, "is_scale_quant": False}
    return {
        "quant_method": "quark", "quant_mode": "eager_mode", "version": "latent-quantize_np",
        "exclude": list(MXFP4_EXCLUDE),
        "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
                   "weight_format": "real_quantized", "weight_merge_groups": None},
        "global_quant_config": {"weight": spec, "input_tensors": dict(spec, is_dynamic=True),
                                "output_tensors": None, "bias": None, "target_device": None},
        "layer_quant_config": {}, "layer_type_quant_config": {}, "kv_cache_quant_config": {},
        "kv_cache_post_rope": False, "algo_config": None, "softmax_quant_spec": None,
        "latent_note": ("written by latent tools/quantize_np.py: routed experts only; E2M1 round "
                        "half-to-even with saturation; e8m0 scale = OCP floor rule "
                        f"('{rule}'); element 2k in the low nibble. Dense layer 0, shared experts, "
                        "attention, router and lm_head stay bf16 (exclude list)."),
    }


def quantize_dir_mxfp4(src, dst, rule="floor"):
    T, meta = load_dir(src)
    cfg = _copy_side_files(src, dst)
    out, nq = {}, 0
    for k, t in T.items():
        mod = k[:-len(".weight")] if k.endswith(".weight") else None
        if mod and EXPERT_RE.match(mod) and not quark_excluded(mod, MXFP4_EXCLUDE):
            packed, sc = mxfp4_quantize(t.f32(), rule)
            out[k] = from_np(packed, "U8")
            out[mod + ".weight_scale"] = from_np(sc, "U8")
            nq += 1
        else:
            out[k] = t
    cfg["quantization_config"] = quark_mxfp4_config(rule)
    write_safetensors(os.path.join(dst, "model.safetensors"), out, meta or {"format": "pt"})
    _write_config(dst, cfg)
    return nq


# not quantized (docs/quantization.md §block-fp8): lm_head, embeddings, norms, router gate + bias,
# indexer weights_proj / k_norm
FP8_SKIP_RE = re.compile(r"(^lm_head\.|embed_tokens|norm\.|layernorm|\.mlp\.gate\.|e_score_correction_bias|weights_proj)")


def quantize_dir_fp8(src, dst, block=128):
    T, meta = load_dir(src)
    cfg = _copy_side_files(src, dst)
    out, nq = {}, 0
    for k, t in T.items():
        if k.endswith(".weight") and len(t.shape) == 2 and not FP8_SKIP_RE.search(k):
            codes, sinv = fp8_block_quantize(t.f32(), block)
            out[k] = from_np(codes, "F8_E4M3")
            out[k + "_scale_inv"] = from_np(sinv, "F32")
            nq += 1
        else:
            out[k] = t
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [block, block]}
    write_safetensors(os.path.join(dst, "model.safetensors"), out, meta or {"format": "pt"})
    _write_config(dst, cfg)
    return nq


def dequantize_tensors(T, cfg):
    """Return {name: float32 ndarray} of the logical (dequantized) weights; non-float tensors dropped."""
    qc = cfg.get("quantization_config") or {}
    block = (qc.get("weight_block_size") or [128, 128])[0]
    out = {}
    for k, t in T.items():
        if k.endswith("_scale_inv") or k.endswith(".weight_scale"):
            continue
        if t.dtype == "U8" and (k + "_scale") in T:
            out[k] = mxfp4_dequantize(t.raw(), T[k + "_scale"].raw())
        elif t.dtype == "F8_E4M3":
            out[k] = fp8_block_dequantize(t.raw(), T[k + "_scale_inv"].raw(), block)
        else:
            out[k] = t.f32()
    return out


def dequantize_dir(src, dst, dtype="F32"):
    """Write an unquantized checkpoint (no quantization_config): dequantized tensors in `dtype`
    (F32 exact; BF16 = RNE of the fp32 dequant), other tensors in F32 (or copied as stored for BF16)."""
    T, meta = load_dir(src)
    cfg = _copy_side_files(src, dst)
    deq = dequantize_tensors(T, cfg)
    out = {}
    for k, v in deq.items():
        if dtype == "BF16" and T[k].dtype in ("BF16", "F32"):
            out[k] = T[k]
        else:
            out[k] = from_np(v, dtype)
    cfg.pop("quantization_config", None)
    write_safetensors(os.path.join(dst, "model.safetensors"), out, meta or {"format": "pt"})
    _write_config(dst, cfg)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["mxfp4", "fp8", "dequant"])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--scale-rule", default="floor", choices=["floor", "even", "ceil"])
    ap.add_argument("--dtype", default="F32", choices=["F32", "BF16"])
    a = ap.parse_args(argv)
    if a.cmd == "mxfp4":
        n = quantize_dir_mxfp4(a.src, a.dst, a.scale_rule)
    elif a.cmd == "fp8":
        n = quantize_dir_fp8(a.src, a.dst)
    else:
        dequantize_dir(a.src, a.dst, a.dtype)
        n = 0
    print(f"{a.cmd}: {a.src} -> {a.dst} ({n} tensors quantized)")


if __name__ == "__main__":
    sys.exit(main())
