/*
 * x86_avx512_ops.c - the per-row ops of the forward pass on AVX-512 (F, DQ), with the
 * reference's results bit for bit: the same operations on the same values in the same
 * precision (double where the reference computes in double), only several lanes at a time.
 * The one exception is a sum over a row in double (RMS norms), whose order differs; it is
 * then rounded to f32, so it shows only when the double sums straddle an f32 rounding point.
 * Only called after the CPU check (cpu.c).
 */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/x86_avx512_e4m3.h"

/* f32 -> the nearest bf16 (ties to even) -> f32, as dsv4_round_bf16 for finite values. */
static inline __m512 round_bf16(__m512 x)
{
    __m512i   u    = _mm512_castps_si512(x);
    __m512i   bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    __m512i   r    = _mm512_and_si512(_mm512_add_epi32(u, bias), _mm512_set1_epi32((int)0xffff0000u));
    /* NaN: quietened and truncated (the bias could carry a NaN into the sign bit or to 0) */
    __mmask16 nan  = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512i   q    = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x400000)), _mm512_set1_epi32((int)0xffff0000u));
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, nan, q));
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
            /* an infinite amax takes the codec's own rule (dsv4_pow2_ceil) */
            __m512 s = _mm512_set1_ps(amax < INFINITY ? dsv4_pow2_ceil_normal(amax * (1.0f / 6.0f))
                                                      : dsv4_act_scale(amax, 6.0f, fl));
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
    /* beyond +-746 the result is inf or 0 anyway; clamping first keeps the reduction exact
     * (constants first, so that a NaN passes through) */
    x         = _mm512_min_pd(_mm512_set1_pd(746.0), _mm512_max_pd(_mm512_set1_pd(-746.0), x));
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

void dsv4_avx512_fp8_sim_rows(float *x, int n, int d, int ld, int block)
{
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * (size_t)ld;
        for (int b = 0; b < d; b += block) {
            __m512 m = _mm512_setzero_ps();
            for (int i = b; i < b + block; i += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(row + i)), m);
            __m512 s = _mm512_set1_ps(e4m3_block_scale(_mm512_reduce_max_ps(m)));
            for (int i = b; i < b + block; i += 16) {
                __m512    v   = _mm512_loadu_ps(row + i);
                __m512    q   = round_bf16(_mm512_mul_ps(e4m3_round(_mm512_div_ps(v, s)), s));
                /* NaN becomes the codec's NaN code 0x7f, which decodes to the default +qNaN */
                __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                _mm512_storeu_ps(row + i, _mm512_mask_mov_ps(q, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000))));
            }
        }
    }
}

/* sum of x[i]^2 in double (each square exact) */
static double sumsq_pd(const float *x, int d)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int     i  = 0;
    for (; i + 16 <= d; i += 16) {
        __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        a0         = _mm512_fmadd_pd(lo, lo, a0);
        a1         = _mm512_fmadd_pd(hi, hi, a1);
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; i < d; i++) s += (double)x[i] * x[i];
    return s;
}

/* 8 values v (double) -> f32 -> bf16, stored as f32 */
static inline void store_bf16_pd(float *y, __m512d v)
{
    __m256 f = _mm512_cvtpd_ps(v);
    _mm256_storeu_ps(y, _mm512_castps512_ps256(round_bf16(_mm512_castps256_ps512(f))));
}

void dsv4_avx512_rmsnorm_row(const float *x, int d, const uint16_t *w, double eps, float *y)
{
    double ss  = sumsq_pd(x, d);
    double inv = 1.0 / sqrt((double)(float)(ss / d) + eps);
    __m512d iv = _mm512_set1_pd(inv);
    int     i  = 0;
    for (; i + 8 <= d; i += 8) {
        __m512d xv = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        __m512  wf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(w + i)))), 16));
        __m512d wv = _mm512_cvtps_pd(_mm512_castps512_ps256(wf));
        store_bf16_pd(y + i, _mm512_mul_pd(wv, _mm512_mul_pd(xv, iv)));
    }
    for (; i < d; i++) y[i] = dsv4_round_bf16((float)((double)dsv4_f32_from_bf16(w[i]) * ((double)x[i] * inv)));
}

/* RoPE of one row's n_vec vectors: c[i], s[i] (f32 values in double) for the half = d_rope/2
 * pairs; each pair (a, b) -> bf16(a c - b s), bf16(a s + b c) in double. */
void dsv4_avx512_rope_row(float *x, int n_vec, int d_full, int d_rope, const double *c, const double *s)
{
    int half = d_rope / 2;
    /* even and odd elements of 16 interleaved floats, and back */
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd  = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i ilv  = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int v = 0; v < n_vec; v++) {
        float *xr = x + (size_t)v * (size_t)d_full + (size_t)(d_full - d_rope);
        int    i  = 0;
        for (; i + 8 <= half; i += 8) {
            __m512  p  = _mm512_loadu_ps(xr + 2 * i); /* 8 pairs */
            __m512d a  = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_permutexvar_ps(even, p)));
            __m512d b  = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_permutexvar_ps(odd, p)));
            __m512d cv = _mm512_loadu_pd(c + i), sv = _mm512_loadu_pd(s + i);
            __m256  ya = _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_mul_pd(a, cv), _mm512_mul_pd(b, sv)));
            __m256  yb = _mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(a, sv), _mm512_mul_pd(b, cv)));
            __m512  y  = _mm512_permutex2var_ps(_mm512_castps256_ps512(ya), ilv, _mm512_castps256_ps512(yb));
            _mm512_storeu_ps(xr + 2 * i, round_bf16(y));
        }
        for (; i < half; i++) {
            double a = xr[2 * i], b = xr[2 * i + 1];
            xr[2 * i]     = dsv4_round_bf16((float)(a * c[i] - b * s[i]));
            xr[2 * i + 1] = dsv4_round_bf16((float)(a * s[i] + b * c[i]));
        }
    }
}

/* The butterflies of stride len < 8 inside one register of 8 doubles: lane j pairs with
 * j ^ len; the lower lane gets a + b, the upper b' = a - b. */
static inline __m512d butterfly_in(__m512d v, int len)
{
    __m512d sw = len == 1 ? _mm512_permute_pd(v, 0x55) : len == 2 ? _mm512_permutex_pd(v, 0x4e)
                                                               : _mm512_shuffle_f64x2(v, v, 0x4e);
    __mmask8 upper = len == 1 ? 0xaa : len == 2 ? 0xcc : 0xf0;
    return _mm512_mask_blend_pd(upper, _mm512_add_pd(v, sw), _mm512_sub_pd(sw, v));
}

void dsv4_avx512_hadamard_rows(float *x, int n, int d)
{
    /* d: a power of two, 8 <= d <= 4096 */
    __m512d v[512];
    double  scale = 1.0 / sqrt((double)d);
    int     nv    = d / 8;
    for (int r = 0; r < n; r++) {
        float *xr = x + (size_t)r * (size_t)d;
        for (int k = 0; k < nv; k++) v[k] = _mm512_cvtps_pd(_mm256_loadu_ps(xr + 8 * k));
        for (int len = 1; len < 8 && len < d; len *= 2)
            for (int k = 0; k < nv; k++) v[k] = butterfly_in(v[k], len);
        for (int lv = 1; lv < nv; lv *= 2)
            for (int k = 0; k < nv; k += 2 * lv)
                for (int j = k; j < k + lv; j++) {
                    __m512d a = v[j], b = v[j + lv];
                    v[j]      = _mm512_add_pd(a, b);
                    v[j + lv] = _mm512_sub_pd(a, b);
                }
        __m512d sc = _mm512_set1_pd(scale);
        for (int k = 0; k < nv; k++) store_bf16_pd(xr + 8 * k, _mm512_mul_pd(v[k], sc));
    }
}

/* ------------------------------------------------------------------ activation quantiser */

/* The f32 levels' activation quantiser (ops_fast.c quantise_row lane by lane, as
 * dsv4_avx2_quant_f32): amax ignoring NaN, s = dsv4_act_scale(amax, 448, 1e-4),
 * q = e4m3(x * (1 / s)) * s. Whole vectors use plain loads, the short last block a mask
 * (per-iteration masks made this loop 4x slower on Zen 4: x86_avx512bf16.c quant_bf16). */
void dsv4_avx512_quant_f32(const float *x, int n, float *out)
{
    for (int b = 0; b < n; b += 128) {
        int       e = b + 128 < n ? b + 128 : n, full = b + (e - b) / 16 * 16, k;
        __mmask16 tail = (__mmask16)((1u << (e - full)) - 1);
        float     s    = e4m3_block_scale_of(x, b, full, tail);
        __m512 iv = _mm512_set1_ps(1.0f / s), sv = _mm512_set1_ps(s);
        for (k = b; k < full; k += 16)
            _mm512_storeu_ps(out + k, _mm512_mul_ps(e4m3_round(_mm512_mul_ps(_mm512_loadu_ps(x + k), iv)), sv));
        if (tail)
            _mm512_mask_storeu_ps(out + k, tail,
                                  _mm512_mul_ps(e4m3_round(_mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + k), iv)), sv));
    }
}

/* ------------------------------------------------------------------ data ops (ops_data.c) */

static inline __m512d lo_pd(__m512 v)
{
    return _mm512_cvtps_pd(_mm512_castps512_ps256(v));
}

static inline __m512d hi_pd(__m512 v)
{
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* Two vectors of 8 doubles -> f32 (each rounded once) -> bf16, as 16 floats in lane order. */
static inline __m512 bf16_of_pd(__m512d lo, __m512d hi)
{
    return round_bf16(_mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1));
}

void dsv4_avx512_bf16_to_f32(const uint16_t *h, size_t n, float *x)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + i))), 16)));
    for (; i < n; i++) x[i] = dsv4_f32_from_bf16(h[i]);
}

void dsv4_avx512_scale_rows(float *x, size_t n, double s)
{
    __m512d sv = _mm512_set1_pd(s);
    size_t  i  = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(x + i, bf16_of_pd(_mm512_mul_pd(lo_pd(v), sv), _mm512_mul_pd(hi_pd(v), sv)));
    }
    for (; i < n; i++) x[i] = dsv4_round_bf16((float)(x[i] * s));
}

void dsv4_avx512_add_rows(float *x, const float *e, size_t n)
{
    /* in double, then f32, as the plain C (see dsv4_avx2_add_rows) */
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i), w = _mm512_loadu_ps(e + i);
        _mm512_storeu_ps(x + i, bf16_of_pd(_mm512_add_pd(lo_pd(v), lo_pd(w)), _mm512_add_pd(hi_pd(v), hi_pd(w))));
    }
    for (; i < n; i++) x[i] = dsv4_round_bf16((float)((double)x[i] + e[i]));
}

void dsv4_avx512_combine_row(int k, int d, const int *p, const float *ye, const float *sh, float *f)
{
    /* each lane sums its column from 0 in the pairs' order, as the plain C loop */
    int i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
        for (int s = 0; s < k; s++) {
            __m512 y = _mm512_loadu_ps(ye + (size_t)p[s] * (size_t)d + (size_t)i);
            a0       = _mm512_add_pd(a0, lo_pd(y));
            a1       = _mm512_add_pd(a1, hi_pd(y));
        }
        __m512 h = _mm512_loadu_ps(sh + i);
        _mm512_storeu_ps(f + i, bf16_of_pd(_mm512_add_pd(a0, lo_pd(h)), _mm512_add_pd(a1, hi_pd(h))));
    }
    for (; i < d; i++) {
        double acc = 0;
        for (int s = 0; s < k; s++) acc += ye[(size_t)p[s] * (size_t)d + (size_t)i];
        f[i] = dsv4_round_bf16((float)(acc + sh[i]));
    }
}
