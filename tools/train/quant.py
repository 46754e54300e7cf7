"""quant.py - the number formats of the release layout, for the exporter and for QAT.

Owns: rounding to e4m3 and e2m1 with power-of-two (e8m0) scales, exactly as the stored
codes decode (docs/MODEL.md §R5): dense projections as FP8 with one scale per 128x128 block,
routed experts as FP4 with one scale per 32 inputs of a row, activations as e4m3 per 128
inputs of a token. The same functions quantise the weights at export and simulate that
quantisation during quantisation-aware training, so the exported checkpoint holds exactly
the weights the last training steps saw.

Scale choice: the reference takes 2^ceil(log2(amax / qmax)) for activations (kept here).
For weights any power of two is valid; we try that one and the next smaller (which lets the
largest values saturate at qmax but halves every other value's step) and keep the one with
the smaller squared error per block. For FP4 this matters: with the ceil scale a block's
largest value can land on code 3 of a grid that ends at 6.
"""

import numpy as np
import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def round_e4m3(y):
    """Nearest e4m3 value (ties to even), saturating at +-448."""
    y = torch.clamp(y, -E4M3_MAX, E4M3_MAX)
    a = y.abs()
    e = torch.floor(torch.log2(torch.clamp(a, min=2.0 ** -30))).clamp(min=-6)
    step = torch.pow(2.0, e - 3)
    return torch.sign(y) * torch.clamp(torch.round(a / step) * step, max=E4M3_MAX)


def round_e2m1(y):
    """Nearest e2m1 value (ties to even), saturating at +-6."""
    y = torch.clamp(y, -E2M1_MAX, E2M1_MAX)
    a = y.abs()
    e = torch.floor(torch.log2(torch.clamp(a, min=2.0 ** -30))).clamp(min=0)
    step = torch.pow(2.0, e - 1)
    return torch.sign(y) * torch.clamp(torch.round(a / step) * step, max=E2M1_MAX)


def _ceil_exp(amax, qmax, floor=1e-30):
    return torch.ceil(torch.log2(torch.clamp(amax, min=floor) / qmax))


def _best_exp(blocks, qmax, rnd):
    """blocks [..., n]: per block, the exponent (of {ceil, ceil-1}) with the smaller error."""
    amax = blocks.abs().amax(-1, keepdim=True)
    e0 = _ceil_exp(amax, qmax)
    best_e, best_err = None, None
    for e in (e0, e0 - 1):
        s = torch.pow(2.0, e)
        err = ((rnd(blocks / s) * s - blocks) ** 2).sum(-1, keepdim=True)
        if best_e is None:
            best_e, best_err = e, err
        else:
            take = err < best_err
            best_e = torch.where(take, e, best_e)
            best_err = torch.where(take, err, best_err)
    return best_e


def fp8_blocks(w):
    """w [out, in] -> (dequantised w, exponents [ceil(out/128), ceil(in/128)])."""
    o, i = w.shape
    po, pi = (-o) % 128, (-i) % 128
    wp = torch.nn.functional.pad(w, (0, pi, 0, po))
    bo, bi = wp.shape[0] // 128, wp.shape[1] // 128
    blocks = wp.reshape(bo, 128, bi, 128).permute(0, 2, 1, 3).reshape(bo, bi, 128 * 128)
    e = _best_exp(blocks, E4M3_MAX, round_e4m3)
    s = torch.pow(2.0, e)
    q = (round_e4m3(blocks / s) * s).reshape(bo, bi, 128, 128).permute(0, 2, 1, 3).reshape(bo * 128, bi * 128)
    return q[:o, :i], e.reshape(bo, bi)


def fp4_rows(w):
    """w [out, in] (in % 32 == 0) -> (dequantised w, exponents [out, in/32])."""
    o, i = w.shape
    blocks = w.reshape(o, i // 32, 32)
    e = _best_exp(blocks, E2M1_MAX, round_e2m1)
    s = torch.pow(2.0, e)
    return (round_e2m1(blocks / s) * s).reshape(o, i), e.reshape(o, i // 32)


def act_e4m3(x, block=128, floor=1e-4):
    """The reference's act_quant: per `block` values along the last dim, scale
    2^ceil(log2(max(amax, floor) / 448)), values rounded to e4m3 (quant -> dequant)."""
    shp = x.shape
    xb = x.reshape(*shp[:-1], shp[-1] // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    s = torch.pow(2.0, _ceil_exp(amax, E4M3_MAX, floor))
    return (round_e4m3(xb / s) * s).reshape(shp)


def ste(x, q):
    """Straight-through: the value of q, the gradient of x."""
    return x + (q - x).detach()


# ============================================================================ storage codes


def e4m3_codes(v):
    """Exactly representable e4m3 values (numpy float) -> uint8 codes."""
    v = np.asarray(v, dtype=np.float64)
    sign = (np.signbit(v)).astype(np.uint8) << 7
    a = np.abs(v)
    code = np.zeros(a.shape, dtype=np.uint8)
    nz = a > 0
    e = np.floor(np.log2(np.where(nz, a, 1.0)))
    normal = nz & (e >= -6)
    m = np.where(normal, a / np.exp2(e) - 1.0, a / 2.0 ** -9)    # subnormal: a = m * 2^-9
    exp_field = np.where(normal, e + 7, 0)
    mant = np.where(normal, m * 8, m)
    if not np.all(np.abs(mant - np.round(mant)) == 0):
        raise ValueError("value not representable in e4m3")
    code = ((exp_field.astype(np.int64) << 3) | np.round(mant).astype(np.int64)).astype(np.uint8)
    code = np.where(nz, code, 0).astype(np.uint8)
    return code | sign


def e2m1_nibbles(v):
    """Exactly representable e2m1 values -> 4-bit codes (bit 3 = sign)."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    table = np.array(E2M1_VALUES)
    idx = np.searchsorted(table, a)
    if not np.all(table[np.clip(idx, 0, 7)] == a):
        raise ValueError("value not representable in e2m1")
    return (idx | (np.signbit(v) & (a > 0)).astype(np.int64) << 3).astype(np.uint8)


def pack_fp4(w_q, e):
    """Dequantised FP4 weight [out, in] and exponents [out, in/32] -> (I8 [out, in/2] with the
    even input in the low nibble, E8M0 bytes [out, in/32])."""
    s = np.repeat(np.exp2(e.astype(np.float64)), 32, axis=1)
    nib = e2m1_nibbles(w_q.astype(np.float64) / s)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (e.astype(np.int64) + 127).astype(np.uint8)


def pack_fp8(w_q, e):
    """Dequantised FP8 weight [out, in] and block exponents -> (E4M3 codes, E8M0 bytes)."""
    o, i = w_q.shape
    s = np.repeat(np.repeat(np.exp2(e.astype(np.float64)), 128, axis=0), 128, axis=1)[:o, :i]
    return e4m3_codes(w_q.astype(np.float64) / s), (e.astype(np.int64) + 127).astype(np.uint8)
