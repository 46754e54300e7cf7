// act_sim.comp - the ops fp8_sim and fp4_sim (backend.h): in place over blocks of `block`
// values of each row, the power-of-two scale s = 2^ceil(log2(f32(max(amax, floor) * f32(1/qmax))))
// and each value x replaced by bf16(round(x / s) * s), round to e4m3 (fp8: 3 mantissa bits,
// min normal exponent -6, saturating at 448, NaN stays NaN) or e2m1 (fp4: 1 bit, exponent 0,
// saturating at 6, NaN to 0), as src/backend/cpu/ref_quant.c with core's codecs. x / s and
// round(...) * s are exact in double (s is a power of two), and the rounding to the minifloat
// is done on the double's exponent and roundEven, so no float mode of the device reaches it.
// The maximum ignores NaN (fmaxf) and compares magnitudes as bits. One invocation per block.
// e4m3_scale (fp4_sim for DeepSeek-V4.1's compressed KV): s = e4m3(max(amax, floor) / 6), not a
// power of two, and x / s is the f32 quotient: the double quotient rounded once to f32 is the
// same number, as the exact one never lies within 2^-53 of an f32 rounding boundary for these
// divisors (a 4-bit s times a power of two), and saturation clamps the quotient to 6.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { uint x0, n, d, ld, block, fp8, e4m3_scale; float inv_qmax, floor_; } p;

// |a| (finite) rounded to `mbits` mantissa bits with minimum normal exponent emin, ties to even
double round_mini(double a, int mbits, int emin)
{
    if (a == 0.0LF) return 0.0LF;
    int e;
    frexp(a, e);
    e = max(e - 1, emin);
    double q = roundEven(ldexp(a, mbits - e));
    return ldexp(q, e - mbits); // q = 2^(mbits+1) after rounding up is the next binade's 1.0
}

// max(amax, floor) of block b0 as f32, NaN ignored.
float block_amax(uint b0)
{
    uint amax = 0u;
    for (uint i = 0u; i < p.block; i++) {
        uint m = floatBitsToUint(x[b0 + i]) & 0x7fffffffu;
        if (m <= 0x7f800000u && m > amax) amax = m;
    }
    float a = uintBitsToFloat(amax);
    return a >= p.floor_ ? a : p.floor_;
}

// e4m3(amax / 6): the f32 quotient rounded to 3 mantissa bits (exponent >= -6), saturating.
float e4m3_scale(uint b0)
{
    float q = float(double(block_amax(b0)) / 6.0LF);
    return float(round_mini(min(double(q), 448.0LF), 3, -6));
}

float block_scale(uint b0)
{
    if (p.e4m3_scale != 0u) return e4m3_scale(b0);
    float a = block_amax(b0);
    float prod = float(double(a) * double(p.inv_qmax)); // the f32 product, rounded once
    if (isinf(prod)) return 1.0; // core's dsv4_pow2_ceil: an infinite maximum saturates
    int   e;
    float m = frexp(prod, e);
    return m == 0.5 ? prod : ldexp(1.0, e);
}

void main()
{
    uint nb = p.d / p.block, total = p.n * nb, stride = gl_NumWorkGroups.x * 64u;
    double qmax = p.fp8 != 0u ? 448.0LF : 6.0LF;
    for (uint k = gl_GlobalInvocationID.x; k < total; k += stride) {
        uint   b0 = p.x0 + (k / nb) * p.ld + (k % nb) * p.block;
        double s  = double(block_scale(b0));
        for (uint i = 0u; i < p.block; i++) {
            uint u = floatBitsToUint(x[b0 + i]);
            if ((u & 0x7fffffffu) > 0x7f800000u) { // NaN: e4m3 keeps it (core's quiet NaN), e2m1 has none
                x[b0 + i] = p.fp8 != 0u ? uintBitsToFloat(0x7fc00000u) : 0.0;
                continue;
            }
            double a = abs(double(uintBitsToFloat(u & 0x7fffffffu))) / s;
            if (p.e4m3_scale != 0u) a = double(float(a)); // the f32 quotient (see the top)
            a = min(a, qmax);
            double v = round_mini(a, p.fp8 != 0u ? 3 : 1, p.fp8 != 0u ? -6 : 0) * s;
            float  f = float(v);
            x[b0 + i] = round_bf16((u >> 31) != 0u ? -f : f);
        }
    }
}
