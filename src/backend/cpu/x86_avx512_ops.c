/*
 * x86_avx512_ops.c - the per-row ops that run on every query head on AVX-512 (F, DQ), with
 * the reference's results bit for bit: the FP4 simulation of the indexer queries and the
 * sums of squares of the per-head RMS norm. Only called after the CPU check (cpu.c).
 */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu.h"

/* f32 -> the nearest bf16 (ties to even) -> f32, as dsv4_round_bf16 for finite values. */
static inline __m512 round_bf16(__m512 x)
{
    __m512i u    = _mm512_castps_si512(x);
    __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_add_epi32(u, bias), _mm512_set1_epi32((int)0xffff0000u)));
}

/* The nearest e2m1 value (ties to even, |v| clamped to 6, NaN to +0) of v, as an f32:
 * the grid steps are 0.5 below 2, 1 below 4 and 2 up to 6, all powers of two, so v / step
 * is exact and rounding it to an integer is the minifloat rounding. */
static inline __m512 e2m1_nearest(__m512 v)
{
    __m512    a    = _mm512_min_ps(_mm512_abs_ps(v), _mm512_set1_ps(6.0f));
    __mmask16 lt2  = _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.0f), _CMP_LT_OQ);
    __mmask16 lt4  = _mm512_cmp_ps_mask(a, _mm512_set1_ps(4.0f), _CMP_LT_OQ);
    __m512    inv  = _mm512_mask_blend_ps(lt4, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f));
    inv            = _mm512_mask_blend_ps(lt2, inv, _mm512_set1_ps(2.0f));
    __m512    q    = _mm512_div_ps(_mm512_roundscale_ps(_mm512_mul_ps(a, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), inv);
    __m512    sign = _mm512_and_ps(v, _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000u)));
    __mmask16 nan  = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_maskz_mov_ps((__mmask16)~nan, _mm512_or_ps(q, sign));
}

/* 2^ceil(log2 x) of a normal positive x, on the bits (dsv4_pow2_ceil). */
static inline float pow2_ceil(float x)
{
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    if (u & 0x7fffffu) u = (u & 0x7f800000u) + 0x800000u;
    float r;
    __builtin_memcpy(&r, &u, 4);
    return r;
}

void dsv4_avx512_fp4_sim_rows(float *x, int n, int d, int ld)
{
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * (size_t)ld;
        for (int b = 0; b < d; b += 32) {
            __m512 v0 = _mm512_loadu_ps(row + b), v1 = _mm512_loadu_ps(row + b + 16);
            /* NaN lanes are ignored, as by fmaxf: max_ps returns its second operand then */
            __m512 m    = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps()));
            float  amax = _mm512_reduce_max_ps(m);
            float  fl   = 6.0f * 0x1p-126f;
            if (!(amax >= fl)) amax = fl;
            __m512 s = _mm512_set1_ps(pow2_ceil(amax * (1.0f / 6.0f)));
            _mm512_storeu_ps(row + b, _mm512_mul_ps(e2m1_nearest(_mm512_div_ps(v0, s)), s));
            _mm512_storeu_ps(row + b + 16, _mm512_mul_ps(e2m1_nearest(_mm512_div_ps(v1, s)), s));
        }
    }
}

double dsv4_avx512_sumsq_bf16(const float *v, int d)
{
    /* sum of bf16(v[i]^2) in double, exact for any realistic spread of magnitudes, so the
     * order of the additions does not show */
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    int     i    = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 x  = _mm512_loadu_ps(v + i);
        __m512 sq = round_bf16(_mm512_mul_ps(x, x));
        acc0      = _mm512_add_pd(acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        acc1      = _mm512_add_pd(acc1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
    for (; i < d; i++) s += dsv4_round_bf16(v[i] * v[i]);
    return s;
}

void dsv4_avx512_scale_bf16(float *v, int d, float r)
{
    int    i  = 0;
    __m512 rv = _mm512_set1_ps(r);
    for (; i + 16 <= d; i += 16) _mm512_storeu_ps(v + i, round_bf16(_mm512_mul_ps(_mm512_loadu_ps(v + i), rv)));
    for (; i < d; i++) v[i] = dsv4_round_bf16(v[i] * r);
}
