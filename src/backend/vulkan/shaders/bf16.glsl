// bf16.glsl - the bf16 rounding of core.h (dsv4_bf16_from_f32): round to nearest even on the
// bits, a NaN stays a quiet NaN. Integer operations only, so the device's float modes
// (denormal flushing, fast math) cannot change it.
float round_bf16(float v)
{
    uint u = floatBitsToUint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uintBitsToFloat(((u >> 16) | 0x40u) << 16);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uintBitsToFloat(u & 0xffff0000u);
}

// The bf16 value h (an index in bf16 elements) of a buffer read as 32-bit words.
#define BF16_AT(words, h) uintBitsToFloat(((((h) & 1u) != 0u ? (words[(h) >> 1] >> 16) : (words[(h) >> 1] & 0xffffu))) << 16)
