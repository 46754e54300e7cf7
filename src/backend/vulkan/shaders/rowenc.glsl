// rowenc.glsl - encoding one row into the stored formats (row_codec.c), by a workgroup of 64
// into shared bytes rb[] (one per uint): per block a power-of-two scale 2^ceil(log2(max(amax,
// floor) * f32(1 / qmax))) (exact on the bits: dsv4_pow2_ceil, dsv4_e8m0_from_f32), codes by
// round-to-nearest-even of x / scale (x times the scale's exact inverse), saturating, as
// core/numfmt.c. Needs bf16.glsl and a shared uint rb[] and float rscale[].

// dsv4_pow2_ceil for a normal positive x (an infinity gives 1).
float pow2_ceil(float x)
{
    uint u = floatBitsToUint(x);
    if (isinf(x)) return 1.0;
    return (u & 0x7fffffu) == 0u ? x : uintBitsToFloat(((u >> 23) + 1u) << 23);
}

// x / s for a power of two s, exactly as the division rounds.
float div_pow2(float x, float s)
{
    return x * uintBitsToFloat((254u - (floatBitsToUint(s) >> 23)) << 23);
}

uint e4m3_code(float x)
{
    if (isnan(x)) return 0x7fu;
    uint  sign = (floatBitsToUint(x) >> 31) != 0u ? 0x80u : 0u;
    float a    = min(abs(x), 448.0);
    if (a < 1.0 / 64.0) return sign | uint(roundEven(a * 512.0));
    int   e = int((floatBitsToUint(a) >> 23) & 0xffu) - 127;
    float q = roundEven(uintBitsToFloat((floatBitsToUint(a) & 0x7fffffu) | 0x3f800000u) * 8.0);
    if (q == 16.0) e++, q = 8.0;
    return sign | (uint(e + 7) << 3) | (uint(q) - 8u);
}

uint e2m1_code(float x)
{
    if (isnan(x)) return 0u;
    uint  sign = (floatBitsToUint(x) >> 31) != 0u ? 8u : 0u;
    float a    = min(abs(x), 6.0);
    if (a < 1.0) return sign | uint(roundEven(a * 2.0));
    int   e = int((floatBitsToUint(a) >> 23) & 0xffu) - 127;
    float q = roundEven(uintBitsToFloat((floatBitsToUint(a) & 0x7fffffu) | 0x3f800000u) * 2.0);
    if (q == 4.0) e++, q = 2.0;
    return sign | (uint(e + 1) << 1) | (uint(q) - 2u);
}

// The scale of a block of n values from x[at] (f32 max(amax, floor) times inv_qmax).
float block_scale(uint at, uint n, float fl, float inv_qmax)
{
    float m = 0.0;
    for (uint i = 0u; i < n; i++) {
        float a = abs(XV(at + i));
        if (a > m) m = a; // fmaxf: a NaN is skipped
    }
    if (!(m >= fl)) m = fl;
    return pow2_ceil(m * inv_qmax);
}

void put_bf16(uint at, float v)
{
    uint h = floatBitsToUint(round_bf16(v)) >> 16;
    rb[at] = h & 0xffu;
    rb[at + 1u] = h >> 8;
}

// The row of d values from x[x0] (dr of them rope) into rb[] in fmt; uniform control flow.
void encode_row(uint x0, uint fmt, uint d, uint dr)
{
    uint lid = gl_LocalInvocationID.x;
    if (fmt == 1u) {
        for (uint i = lid; i < d; i += 64u) put_bf16(2u * i, XV(x0 + i));
        return;
    }
    bool fp4 = fmt == 2u;
    uint dn = fp4 ? d : d - dr, bs = fp4 ? 32u : 64u, nb = dn / bs, cb = fp4 ? d / 2u : dn;
    for (uint b = lid; b < nb; b += 64u) {
        float s = fp4 ? block_scale(x0 + b * bs, bs, uintBitsToFloat(0x01c00000u), uintBitsToFloat(0x3e2aaaabu))
                      : block_scale(x0 + b * bs, bs, uintBitsToFloat(0x38d1b717u), uintBitsToFloat(0x3b124925u));
        rscale[b] = s;
        rb[cb + b] = floatBitsToUint(s) >> 23; // e8m0 of a normal power of two: its exponent field
    }
    barrier();
    if (fp4) {
        for (uint i = lid; i < d / 2u; i += 64u) {
            uint b = (2u * i) / 32u;
            rb[i] = e2m1_code(div_pow2(XV(x0 + 2u * i), rscale[b])) |
                    (e2m1_code(div_pow2(XV(x0 + 2u * i + 1u), rscale[b])) << 4);
        }
        return;
    }
    for (uint i = lid; i < dn; i += 64u) rb[i] = e4m3_code(div_pow2(XV(x0 + i), rscale[i / 64u]));
    for (uint i = lid; i < dr; i += 64u) put_bf16(dn + nb + 2u * i, XV(x0 + dn + i));
}

// rb[0 .. n) to the bytes at a: whole words stored, the words shared with other bytes (a
// neighbouring row, or what lies around the rows) merged with atomics.
void write_bytes(uint64_t a, uint n)
{
    uint64_t w0 = a & ~uint64_t(3);
    uint     nw = uint(((a + uint64_t(n) + uint64_t(3)) & ~uint64_t(3)) - w0) / 4u;
    for (uint k = gl_LocalInvocationID.x; k < nw; k += 64u) {
        uint val = 0u, mask = 0u;
        for (uint b = 0u; b < 4u; b++) {
            uint64_t ba = w0 + uint64_t(4u * k + b);
            if (ba < a || ba >= a + uint64_t(n)) continue;
            val |= rb[uint(ba - a)] << (8u * b);
            mask |= 0xffu << (8u * b);
        }
        WordRef wr = WordRef(w0 + uint64_t(4u * k));
        if (mask == 0xffffffffu) {
            wr.w[0] = val;
        } else {
            atomicAnd(wr.w[0], ~mask);
            atomicOr(wr.w[0], val);
        }
    }
}
