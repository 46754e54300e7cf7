/*
 * x86_avx512_e4m3.h - e4m3 rounding on AVX-512F for the bf16 activation quantiser
 * (x86_avx512bf16.c; the f32 levels' quantiser and FP8 cache simulation are simd_rows.inc's,
 * the same rounding lane for lane); included only by files compiled with -mavx512f.
 */
#ifndef DSV4_X86_AVX512_E4M3_H
#define DSV4_X86_AVX512_E4M3_H

#include <immintrin.h>

/* v (already divided by its power-of-two block scale) rounded to the nearest e4m3 value, as
 * the codec does lane by lane: ties to even, multiples of 2^-9 below 2^-6, saturation at 448,
 * NaN to 448. */
static inline __m512 e4m3_round(__m512 v)
{
    __m512 a = _mm512_abs_ps(v);
    /* subnormal codes: multiples of 2^-9, ties to even */
    __m512 rs = _mm512_mul_ps(
        _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(512.0f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        _mm512_set1_ps(1.0f / 512.0f));
    /* normal: 3 mantissa bits, ties to even, on the float's bits */
    __m512i u = _mm512_castps_si512(a);
    u = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                                                              _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1)))),
                         _mm512_set1_epi32((int)0xfff00000u));
    __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ), _mm512_castsi512_ps(u), rs);
    r        = _mm512_min_ps(r, _mm512_set1_ps(448.0f)); /* NaN -> 448, as fminf */
    return _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_castps_si512(r), _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u))));
}

/* The e4m3 block scale dsv4_act_scale(amax, 448, 1e-4), inline for finite amax (the product
 * is then a normal float); an infinite amax takes the codec's own rule. */
static inline float e4m3_block_scale(float amax)
{
    if (!(amax >= 1e-4f)) amax = 1e-4f;
    if (!(amax < __builtin_inff())) return dsv4_act_scale(amax, 448.0f, 1e-4f);
    return dsv4_pow2_ceil_normal(amax * (1.0f / 448.0f));
}

/* The activation quantiser's block scale of x[b, e): amax over the whole vectors [b, full)
 * with plain loads and the tail (the lanes of the mask, from full) with a masked load; a NaN
 * |x| leaves the maximum, as fmaxf does. */
static inline float e4m3_block_scale_of(const float *x, int b, int full, __mmask16 tail)
{
    __m512 m = _mm512_setzero_ps();
    int    k = b;
    for (; k < full; k += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k)), m);
    if (tail) m = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(tail, x + k)), m);
    return e4m3_block_scale(_mm512_reduce_max_ps(m));
}

#endif
