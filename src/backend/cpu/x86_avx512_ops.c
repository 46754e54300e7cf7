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
            __m512 s = _mm512_set1_ps(dsv4_pow2_ceil_normal(amax * (1.0f / 6.0f)));
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

/* e^x in double, 8 lanes: 2^n e^r with r = x - n ln2 (ln2 split in two so r is exact to
 * ~1e-20), |r| <= ln2/2, Taylor series to degree 13 (truncation below 1e-17 relative), then
 * VSCALEFPD, which also gives inf and 0 beyond the range. Within an ulp or two of libm's exp,
 * so results rounded to f32 agree with the reference's but for ties closer than 2^-50. */
static inline __m512d exp_pd(__m512d x)
{
    __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), x);
    r         = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
    static const double inv_fact[14] = { 1.0,
                                         1.0,
                                         1.0 / 2,
                                         1.0 / 6,
                                         1.0 / 24,
                                         1.0 / 120,
                                         1.0 / 720,
                                         1.0 / 5040,
                                         1.0 / 40320,
                                         1.0 / 362880,
                                         1.0 / 3628800,
                                         1.0 / 39916800,
                                         1.0 / 479001600,
                                         1.0 / 6227020800.0 };
    __m512d p = _mm512_set1_pd(inv_fact[13]);
    for (int k = 12; k >= 0; k--) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(inv_fact[k]));
    /* n is clamped so that huge |x| still scales to inf or 0 rather than NaN */
    n = _mm512_min_pd(_mm512_max_pd(n, _mm512_set1_pd(-2000.0)), _mm512_set1_pd(2000.0));
    return _mm512_scalef_pd(p, n);
}

static inline __m512d rf32_pd(__m512d x)
{
    return _mm512_cvtps_pd(_mm512_cvtpd_ps(x));
}

void dsv4_avx512_swiglu_bf16(float *g, const float *v, int n, float w, double limit)
{
    /* g[i] = bf16(f32(w * f32(f32(gg * (1 / (1 + exp(-gg)))) * vv))), gg and vv clamped to
     * limit when it is positive: the reference expert's expression and rounding points */
    __m512d lim = _mm512_set1_pd(limit), wd = _mm512_set1_pd((double)w), one = _mm512_set1_pd(1.0);
    int     i   = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d gg = _mm512_cvtps_pd(_mm256_loadu_ps(g + i)), vv = _mm512_cvtps_pd(_mm256_loadu_ps(v + i));
        if (limit > 0) {
            vv = _mm512_min_pd(_mm512_max_pd(vv, _mm512_sub_pd(_mm512_setzero_pd(), lim)), lim);
            gg = _mm512_min_pd(gg, lim);
        }
        __m512d e = exp_pd(_mm512_sub_pd(_mm512_setzero_pd(), gg));
        __m512d h = rf32_pd(_mm512_mul_pd(rf32_pd(_mm512_mul_pd(gg, _mm512_div_pd(one, _mm512_add_pd(one, e)))), vv));
        h         = rf32_pd(_mm512_mul_pd(wd, h));
        _mm256_storeu_ps(g + i, _mm512_castps512_ps256(round_bf16(_mm512_castps256_ps512(_mm512_cvtpd_ps(h)))));
    }
    for (; i < n; i++) {
        double gg = g[i], vv = v[i];
        if (limit > 0) {
            vv = fmin(fmax(vv, -limit), limit);
            gg = fmin(gg, limit);
        }
        double h = (double)(float)((double)(float)(gg * (1.0 / (1.0 + exp(-gg)))) * vv);
        h        = (double)(float)((double)w * h);
        g[i]     = dsv4_round_bf16((float)h);
    }
}
