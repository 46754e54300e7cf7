// rowfmt.glsl - decoding the stored row formats (backend.h enum dsv4_row_fmt; row_codec.c):
// e4m3 codes with e8m0 scales per 64 and a bf16 rope part, plain bf16, or e2m1 codes with
// e8m0 scales per 32. Bit construction, as core.h decodes them: exact. Needs step.glsl.
const uint FMT_FP8 = 0u, FMT_BF16 = 1u, FMT_IDX_FP4 = 2u;

float f32_e4m3(uint c)
{
    uint e = (c >> 3) & 15u, m = c & 7u;
    if (e == 15u && m == 7u) return uintBitsToFloat(0x7fc00000u);
    float x = e == 0u ? float(m) * (1.0 / 512.0) : uintBitsToFloat(((e + 120u) << 23) | (m << 20));
    return (c & 0x80u) != 0u ? -x : x;
}

float f32_e8m0(uint e)
{
    if (e == 255u) return uintBitsToFloat(0x7fc00000u);
    return e == 0u ? uintBitsToFloat(0x00400000u) : uintBitsToFloat(e << 23);
}

float f32_e2m1(uint c)
{
    const float mag[8] = float[8](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    float v = mag[c & 7u];
    return (c & 8u) != 0u ? -v : v;
}

// Element i of the row at a (d wide, dr of it rope).
float row_elem(uint64_t a, uint fmt, uint d, uint dr, uint i)
{
    if (fmt == FMT_BF16) return uintBitsToFloat(rd16(a + 2u * i) << 16);
    if (fmt == FMT_IDX_FP4) {
        uint c = (rd8(a + i / 2u) >> ((i & 1u) * 4u)) & 15u;
        return f32_e2m1(c) * f32_e8m0(rd8(a + d / 2u + i / 32u));
    }
    uint dn = d - dr;
    if (i < dn) return f32_e4m3(rd8(a + i)) * f32_e8m0(rd8(a + dn + i / 64u));
    return uintBitsToFloat(rd16(a + dn + dn / 64u + 2u * (i - dn)) << 16);
}
