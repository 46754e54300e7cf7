"""numerics.py - number formats and the demo's rounding points, simulated in float64.

Owns: decoding of the stored formats (BF16, e4m3fn, e2m1, e8m0), round-to-nearest-even
encoders for e4m3fn (saturating at 448) and e2m1 (saturating at 6), rounding to float32 and
bfloat16, the power-of-two ("ue8m0") activation scales, and the three quantisation
simulations of the official kernels (docs/MODEL.md §R5.3): act_quant before FP8/FP4 linears
(e4m3, blocks of 128), the in-place FP8 simulation of cached KV (e4m3, blocks of 64) and the
in-place FP4 simulation of indexer q/k (e2m1, blocks of 32); plus the Walsh-Hadamard rotation.

Why here: torch 1.13 has no float8/float4/e8m0 dtypes, so every format is emulated with
lookup tables. Values travel between ops as float64 tensors whose values lie exactly on the
grid of the dtype the demo holds at that point (bf16 or f32); `bf16()` and `f32()` put them
there. Rounding to bf16 always goes through f32 first, as it does in the demo (its bf16
values are produced from f32 accumulators).
"""

import math

import numpy as np
import torch

F64 = torch.float64

# ----------------------------------------------------------------------------- rounding


# When set to a torch.Generator, every rounding point first perturbs its input by a random
# relative amount below one float32 ulp: a model of an engine whose f32 arithmetic differs
# from the reference's exact sums in the last bit. Used by test_ref.py / golden.py to
# measure the noise floor that engines will show against the fixtures; None = exact.
PERTURB = None


def _perturb(x):
    if PERTURB is None or not x.is_floating_point():
        return x
    u = torch.rand(x.shape, generator=PERTURB, dtype=F64) * 2 - 1
    return x * (1 + u * 2.0 ** -24)


def f32(x):
    """Round a float64 tensor to the nearest float32 value (kept as float64)."""
    return _perturb(x).to(torch.float32).to(F64)


def bf16(x):
    """Round to bfloat16, nearest-even, via float32 (kept as float64)."""
    return _perturb(x).to(torch.float32).to(torch.bfloat16).to(F64)


def bf16_bits_to_f64(u16):
    """numpy uint16 array of bfloat16 bit patterns -> float64 torch tensor."""
    u32 = u16.astype(np.uint32) << 16
    return torch.from_numpy(u32.view(np.float32).astype(np.float64))


# ----------------------------------------------------------------------------- decode tables


def _e4m3_value(code):
    s = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return s * (m / 8.0) * 2.0 ** -6
    return s * (1.0 + m / 8.0) * 2.0 ** (e - 7)


E4M3_TABLE = np.array([_e4m3_value(c) for c in range(256)], dtype=np.float64)
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)
E2M1_TABLE = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])


def e8m0_to_f64(u8):
    """numpy uint8 exponents -> float64 powers of two 2^(e-127) (255 is NaN)."""
    e = u8.astype(np.int64)
    v = np.ldexp(1.0, e - 127)
    return np.where(e == 255, np.nan, v)


def e4m3_to_f64(u8):
    return E4M3_TABLE[u8]


def e2m1_packed_to_f64(i8):
    """[out, in/2] bytes, low nibble = even input index -> [out, in] float64."""
    b = i8.view(np.uint8)
    lo, hi = E2M1_TABLE[b & 0xF], E2M1_TABLE[b >> 4]
    out = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), dtype=np.float64)
    out[..., 0::2] = lo
    out[..., 1::2] = hi
    return out


# ----------------------------------------------------------------------------- encoders

# Non-negative finite grids in code order (code == index), so "ties to even" = even index.
_E4M3_POS = torch.tensor(E4M3_TABLE[:127], dtype=F64)      # codes 0x00..0x7e, max 448
_E2M1_POS = torch.tensor(E2M1_MAGNITUDES, dtype=F64)        # codes 0..7, max 6


def _round_to_grid(x, grid):
    """Nearest value of the ascending grid (ties to the even index), sign kept, saturating."""
    a = x.abs().clamp(max=float(grid[-1]))
    hi = torch.searchsorted(grid, a).clamp(max=len(grid) - 1)
    lo = (hi - 1).clamp(min=0)
    vlo, vhi = grid[lo], grid[hi]
    dlo, dhi = a - vlo, vhi - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    v = torch.where(pick_hi, vhi, vlo)
    return torch.where(x < 0, -v, v)


def round_e4m3(x):
    """float -> nearest e4m3fn value (round to nearest even, saturating at +-448)."""
    return _round_to_grid(x, _E4M3_POS)


def round_e2m1(x):
    """float -> nearest e2m1 value (round to nearest even, saturating at +-6)."""
    return _round_to_grid(x, _E2M1_POS)


def e4m3_codes(v):
    """Values on the e4m3fn grid (float64 tensor) -> their uint8 codes (numpy)."""
    mag = torch.searchsorted(_E4M3_POS, v.abs().contiguous())
    return (mag + torch.where(v < 0, 128, 0)).to(torch.uint8).numpy()


def e2m1_codes(v):
    """Values on the e2m1 grid -> 4-bit codes 0..15 (sign = bit 3), numpy uint8."""
    mag = torch.searchsorted(_E2M1_POS, v.abs().contiguous())
    return (mag + torch.where(v < 0, 8, 0)).to(torch.uint8).numpy()


def bf16_bits(v):
    """A float64 tensor -> uint16 bfloat16 bit patterns (nearest even, via f32), numpy."""
    u32 = bf16(v).to(torch.float32).numpy().view(np.uint32)
    return (u32 >> 16).astype(np.uint16)


# ----------------------------------------------------------------------------- scales


def pow2_scale(amax, qmax, floor):
    """The kernels' ue8m0 scale: 2^ceil(log2(max(amax, floor) * f32(1/qmax))), all in f32.
    (fast_round_scale: exponent bits, +1 when the mantissa is non-zero.)"""
    a = torch.clamp(amax.to(torch.float32), min=floor)
    v = a * torch.tensor(1.0 / qmax, dtype=torch.float32)
    m, e = torch.frexp(v)                 # v = m * 2^e, m in [0.5, 1)
    e = torch.where(m == 0.5, e - 1, e)   # exact powers of two keep their exponent
    return torch.ldexp(torch.ones_like(v, dtype=F64), e.to(F64))


def _blocks(x, block):
    n = x.shape[-1]
    assert n % block == 0, f"last dim {n} is not a multiple of the quantisation block {block}"
    return x.reshape(*x.shape[:-1], n // block, block)


def act_quant(x, block=128):
    """Input quantisation of an FP8/FP4 linear: per `block` values along the last dim,
    e4m3(x / s) with s a power of two (amax floor 1e-4). Returns the dequantised values
    q * s, which are what the GEMM effectively multiplies (s is exact)."""
    xb = _blocks(x, block)
    s = pow2_scale(xb.abs().amax(-1, keepdim=True), 448.0, 1e-4)
    return (round_e4m3(xb / s) * s).reshape(x.shape)


def fp8_sim(x, block=64):
    """In-place FP8 simulation of cached KV (act_quant(..., inplace=True)): quantise to e4m3
    with a power-of-two scale per `block`, dequantise back to bf16 (exact in bf16)."""
    return bf16(act_quant(x, block))


def fp4_sim_e4m3(x, block=16):
    """V4.1's compressed-KV FP4 simulation (fp4_act_quant(..., 16, True, scale_dtype=e4m3)):
    e2m1 with an e4m3 scale per `block`, s = e4m3(f32(max(amax, 6 * 2^-9) / 6)) (a scale
    above 448 saturates here), x / s rounded to f32 before the e2m1 rounding (s is not a
    power of two), dequantised back to bf16."""
    xb = _blocks(x, block)
    amax = torch.clamp(xb.abs().amax(-1, keepdim=True), min=6.0 * 2.0 ** -9)
    s = round_e4m3(f32(amax / 6.0))
    q = round_e2m1(torch.clamp(f32(xb / s), -6.0, 6.0))
    return bf16((q * s).reshape(x.shape))


def fp4_sim(x, block=32):
    """In-place FP4 simulation (fp4_act_quant(..., inplace=True)): e2m1 with a power-of-two
    scale per `block` (amax floor 6 * 2^-126), dequantised back to bf16."""
    xb = _blocks(x, block)
    s = pow2_scale(xb.abs().amax(-1, keepdim=True), 6.0, 6.0 * 2.0 ** -126)
    return bf16((round_e2m1(xb / s) * s).reshape(x.shape))


# ----------------------------------------------------------------------------- Hadamard

_HADAMARD = {}


def hadamard_matrix(n):
    """Sylvester (natural order) Walsh-Hadamard matrix H[i][j] = (-1)^popcount(i & j), scaled
    by 1/sqrt(n)."""
    if n not in _HADAMARD:
        assert n & (n - 1) == 0, "Hadamard size must be a power of two"
        i = np.arange(n)
        bits = np.bitwise_and.outer(i, i)
        pop = np.zeros_like(bits)
        while bits.any():
            pop += bits & 1
            bits >>= 1
        h = np.where(pop % 2 == 0, 1.0, -1.0) / math.sqrt(n)
        _HADAMARD[n] = torch.tensor(h, dtype=F64)
    return _HADAMARD[n]


def hadamard(x):
    """bf16(H_n x) over the last dim (fast_hadamard_transform with scale n^-0.5)."""
    return bf16(x @ hadamard_matrix(x.shape[-1]))
