// lin.glsl - a projection's weights as the shaders read them (struct vk_lin_desc in vk.h:
// pieces of piece_rows rows, each with its weight and scale rows at a device address) and
// the release formats decoded exactly, on the bits (core.h: dsv4_f32_from_e4m3, _e2m1,
// _e8m0), so a weight is the same value the reference multiplies.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer LinDesc {
    uint64_t w[16]; // VKW_MAX_PIECES
    uint64_t s[16];
    uint piece_rows, fmt, n_in, scale_f32;
};
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Addrs { uint64_t a[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Words { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Ints { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer OutFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer OutInts { int v[]; };

const uint FMT_BF16 = 0u, FMT_F32 = 1u, FMT_FP8 = 2u, FMT_FP4 = 3u;

uint byte_at(Words b, uint i)
{
    return (b.v[i >> 2] >> ((i & 3u) * 8u)) & 0xffu;
}

float e4m3_value(uint c)
{
    uint e = (c >> 3) & 15u, m = c & 7u;
    if (e == 15u && m == 7u) return uintBitsToFloat(0x7fc00000u);
    if (e == 0u) return ((c & 0x80u) != 0u ? -1.0 : 1.0) * float(m) * (1.0 / 512.0);
    return uintBitsToFloat(((c & 0x80u) << 24) | ((e + 120u) << 23) | (m << 20));
}

float e2m1_value(uint c)
{
    const float mag[8] = float[8](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    float v = mag[c & 7u];
    return (c & 8u) != 0u ? -v : v;
}

float e8m0_value(uint e)
{
    if (e == 255u) return uintBitsToFloat(0x7fc00000u);
    if (e == 0u) return uintBitsToFloat(0x00400000u); // 2^-127
    return uintBitsToFloat(e << 23);
}

// One weight row, resolved once for the k loop: its piece's weight and scale words and the
// row's first element (bytes for e2m1 pairs) and first scale in them.
struct WRow {
    Words w, s;
    uint  base, sbase;
};

WRow weight_row(LinDesc d, uint fmt, uint n_in, uint o)
{
    uint p = o / d.piece_rows, ol = o - p * d.piece_rows;
    WRow r;
    r.w     = Words(d.w[p]);
    r.s     = Words(d.s[p]);
    r.base  = fmt == FMT_FP4 ? ol * (n_in / 2u) : ol * n_in;
    r.sbase = fmt == FMT_FP8 ? (ol / 128u) * ((n_in + 127u) / 128u) : ol * (n_in / 32u);
    return r;
}

float scale_at(WRow r, uint scale_f32, uint i)
{
    return scale_f32 != 0u ? uintBitsToFloat(r.s.v[i]) : e8m0_value(byte_at(r.s, i));
}

// Weight (row, k): code times scale (exact for e8m0).
float weight_el(WRow r, uint fmt, uint scale_f32, uint k)
{
    if (fmt == FMT_BF16) {
        uint h = r.base + k, word = r.w.v[h >> 1];
        return uintBitsToFloat(((h & 1u) != 0u ? (word >> 16) : (word & 0xffffu)) << 16);
    }
    if (fmt == FMT_F32) return uintBitsToFloat(r.w.v[r.base + k]);
    if (fmt == FMT_FP8) return e4m3_value(byte_at(r.w, r.base + k)) * scale_at(r, scale_f32, r.sbase + k / 128u);
    uint b = byte_at(r.w, r.base + k / 2u);
    return e2m1_value((k & 1u) != 0u ? b >> 4 : b & 15u) * scale_at(r, scale_f32, r.sbase + k / 32u);
}
