"""OCP MXFP4 (Quark layout) quantizer used for the latent-demo experts (docs/quantization.md §E2M1, §E8M0, §MXFP4).

Blocks of 32 contiguous elements along the last (input) axis; shared scale e8m0 with the OCP floor rule
se = floor(log2(amax)) - 2 (all-zero block: code 0); elements E2M1 rounded to nearest, ties to even code,
saturating at ±6. Packing: byte k of a row = code(2k) | code(2k+1) << 4; scale code = se + 127 (U8).
"""
import torch

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                            -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _block_exponent(w32):
    """w32: [..., nb, 32] fp32 -> shared exponent se [..., nb] (int32), OCP floor rule."""
    amax = w32.abs().amax(dim=-1)
    # floor(log2(amax)) exactly: frexp gives amax = m * 2^e with m in [0.5, 1)
    _, e = torch.frexp(amax)
    se = (e.to(torch.int32) - 1) - 2
    se = torch.where(amax > 0, se, torch.full_like(se, -127))
    return se.clamp(-127, 127)


def _round_e2m1(x):
    """x: fp32 scaled values -> nearest E2M1 value (RNE on codes, saturating). Returns fp32."""
    a = x.abs()
    r_lo = torch.round(a * 2.0) / 2.0          # [0, 2): step 0.5 (ties to even code)
    r_mid = torch.round(a)                     # [2, 4): step 1
    r_hi = torch.round(a / 2.0) * 2.0          # [4, 8): step 2
    r = torch.where(a < 2.0, r_lo, torch.where(a < 4.0, r_mid, r_hi))
    r = r.clamp(max=6.0)
    return torch.where(x < 0, -r, r)


def fake_quant(w):
    """Quantize-dequantize w [..., K] (K % 32 == 0) in fp32; same values as quantize()+dequantize()."""
    shp = w.shape
    w32 = w.float().reshape(*shp[:-1], shp[-1] // 32, 32)
    se = _block_exponent(w32)
    scale = torch.pow(2.0, se.float()).unsqueeze(-1)
    q = _round_e2m1(w32 / scale) * scale
    return q.reshape(shp).to(w.dtype)


def fake_quant_ste(w):
    """Straight-through estimator: forward = fake_quant(w), gradient = identity."""
    return w + (fake_quant(w.detach()) - w).detach()


def quantize(w):
    """w [out, in] float -> (packed U8 [out, in/2], scale U8 [out, in/32])."""
    assert w.dim() == 2 and w.shape[1] % 32 == 0, w.shape
    out, k = w.shape
    w32 = w.detach().float().cpu().reshape(out, k // 32, 32)
    se = _block_exponent(w32)
    v = _round_e2m1(w32 / torch.pow(2.0, se.float()).unsqueeze(-1))
    mag = v.abs()
    # magnitude -> code 0..7
    code = torch.bucketize(mag, torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]))
    # exact grid values, so bucketize boundaries are never hit
    code = code + torch.where((v < 0) & (mag > 0), 8, 0)
    code = code.to(torch.uint8).reshape(out, k)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).contiguous()
    scale = (se + 127).to(torch.uint8).contiguous()
    return packed, scale


def dequantize(packed, scale):
    """(U8 [out, in/2], U8 [out, in/32]) -> fp32 [out, in]."""
    out = packed.shape[0]
    lo = (packed & 0x0F).long()
    hi = (packed >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(out, -1)
    vals = E2M1_VALUES[codes]
    s = torch.pow(2.0, scale.float() - 127.0)
    return (vals.reshape(out, -1, 32) * s.unsqueeze(-1)).reshape(out, -1)


if __name__ == "__main__":  # self-test
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.05
    p, s = quantize(w)
    d = dequantize(p, s)
    assert torch.equal(d, fake_quant(w)), (d - fake_quant(w)).abs().max()
    rel = ((w - d).norm() / w.norm()).item()
    # tie / saturation vectors: block with amax 1 -> se = -2, scale 0.25
    t = torch.zeros(1, 32)
    t[0, :8] = torch.tensor([1.0, 0.0625, 0.1875, 0.3125, 0.4375, 0.625, 0.875, -1.0])
    dt = dequantize(*quantize(t))[0, :8] / 0.25
    assert dt.tolist() == [4.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, -4.0], dt.tolist()
    t[0, 0] = 1.9  # ratio 7.6 -> saturates to 6
    assert dequantize(*quantize(t))[0, 0].item() == 1.5
    print(f"mxfp4 self-test ok; gaussian relative error {rel:.4f}")
