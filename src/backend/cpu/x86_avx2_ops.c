/*
 * x86_avx2_ops.c - the per-row ops of the forward pass, the f32 activation quantiser and the
 * data ops' arithmetic on AVX2 + FMA, with the reference's results bit for bit: the kernels
 * of x86_avx512_ops.c on 8 f32 / 4 f64 lanes (the same operations on the same values in the
 * same precision), with AVX-512's masks as compare + blend, VRNDSCALE as VROUNDPS/PD and
 * VSCALEFPD as two exact multiplications by built powers of two. The exceptions are those of
 * the AVX-512 file: a row sum in double (RMSNorm, the per-head RMS) is taken in another order
 * and SwiGLU's exp is not libm's; both are rounded to f32 or bf16 before they show, so they
 * differ only at ties narrower than double rounding (none seen in the tests).
 * Compiled with -mavx2 -mfma -mf16c; only called after the CPU check (cpu.c).
 */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu.h"

static inline __m256 abs_ps(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/* f32 -> the nearest bf16 (ties to even) -> f32, as dsv4_round_bf16, NaN included (quietened
 * and truncated: the rounding bias could carry a NaN into the sign bit or to 0). */
static inline __m256 round_bf16(__m256 x)
{
    __m256i u    = _mm256_castps_si256(x);
    __m256i hi   = _mm256_set1_epi32((int)0xffff0000u);
    __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
    __m256i r    = _mm256_and_si256(_mm256_add_epi32(u, bias), hi);
    __m256i q    = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)), hi);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* Two vectors of 4 doubles -> f32 (each rounded once) -> bf16, as 8 floats in lane order. */
static inline __m256 bf16_of_pd(__m256d lo, __m256d hi)
{
    return round_bf16(_mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo)));
}

static inline __m256d lo_pd(__m256 v)
{
    return _mm256_cvtps_pd(_mm256_castps256_ps128(v));
}

static inline __m256d hi_pd(__m256 v)
{
    return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}

/* The maximum of 8 lanes that hold no NaN (any order gives the same value). */
static inline float hmax(__m256 m)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s        = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s        = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline double hsum_pd(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* ------------------------------------------------------------------ FP4 simulation */

/* The nearest e2m1 value (ties to even, |v| clamped to 6, NaN to +0) of v, as an f32: the
 * grid steps are 0.5 below 2, 1 below 4 and 2 up to 6, all powers of two, so v / step is
 * exact and rounding it to an integer is the minifloat rounding. MINPS returns its second
 * operand for a NaN, so a NaN lane computes on 6 and is zeroed at the end. */
static inline __m256 e2m1_nearest(__m256 v)
{
    __m256 a   = _mm256_min_ps(abs_ps(v), _mm256_set1_ps(6.0f));
    __m256 inv = _mm256_blendv_ps(_mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f), _mm256_cmp_ps(a, _mm256_set1_ps(4.0f), _CMP_LT_OQ));
    inv        = _mm256_blendv_ps(inv, _mm256_set1_ps(2.0f), _mm256_cmp_ps(a, _mm256_set1_ps(2.0f), _CMP_LT_OQ));
    __m256 q   = _mm256_div_ps(_mm256_round_ps(_mm256_mul_ps(a, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), inv);
    __m256 sgn = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    return _mm256_andnot_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_or_ps(q, sgn));
}

void dsv4_avx2_fp4_sim_rows(float *x, int n, int d, int ld)
{
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * (size_t)ld;
        for (int b = 0; b < d; b += 32) {
            __m256 v[4], m = _mm256_setzero_ps();
            /* NaN lanes are ignored, as by fmaxf: MAXPS returns its second operand then */
            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_loadu_ps(row + b + 8 * k);
                m    = _mm256_max_ps(abs_ps(v[k]), m);
            }
            float amax = hmax(m);
            float fl   = 6.0f * 0x1p-126f;
            if (!(amax >= fl)) amax = fl;
            /* an infinite amax takes the codec's own rule (dsv4_pow2_ceil) */
            __m256 s = _mm256_set1_ps(amax < INFINITY ? dsv4_pow2_ceil_normal(amax * (1.0f / 6.0f))
                                                      : dsv4_act_scale(amax, 6.0f, fl));
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(row + b + 8 * k, _mm256_mul_ps(e2m1_nearest(_mm256_div_ps(v[k], s)), s));
        }
    }
}

/* ------------------------------------------------------------------ per-head RMS */

double dsv4_avx2_sumsq_bf16(const float *v, int d)
{
    /* sum of bf16(v[i]^2) in double: 8-bit significands, so exact (order-free) unless the
     * squares of one head spread over more than ~2^36 */
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int     i  = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 x  = _mm256_loadu_ps(v + i);
        __m256 sq = round_bf16(_mm256_mul_ps(x, x));
        a0        = _mm256_add_pd(a0, lo_pd(sq));
        a1        = _mm256_add_pd(a1, hi_pd(sq));
    }
    double s = hsum_pd(_mm256_add_pd(a0, a1));
    for (; i < d; i++) s += dsv4_round_bf16(v[i] * v[i]);
    return s;
}

void dsv4_avx2_scale_bf16(float *v, int d, float r)
{
    /* bf16(v * r) in double is bf16(f32 product): the exact product rounds to the same f32 */
    int    i  = 0;
    __m256 rv = _mm256_set1_ps(r);
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(v + i, round_bf16(_mm256_mul_ps(_mm256_loadu_ps(v + i), rv)));
    for (; i < d; i++) v[i] = dsv4_round_bf16(v[i] * r);
}

/* ------------------------------------------------------------------ SwiGLU */

/* 2^n for integral doubles n in [-539, 539], built in the exponent field. */
static inline __m256d pow2_pd(__m128i n)
{
    __m256i e = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(n), _mm256_set1_epi64x(1023)), 52);
    return _mm256_castsi256_pd(e);
}

/* e^x in double, 4 lanes: the AVX-512 exp_pd (x86_avx512_ops.c) step for step, so the two
 * levels agree bit for bit: 2^n e^r with r = x - n ln2 (ln2 in two parts), |r| <= ln2/2,
 * Taylor series to degree 13. VSCALEFPD's p * 2^n (one rounding, inf or 0 beyond the range)
 * becomes p * 2^a * 2^b with a = floor(n / 2), b = n - a: both powers are normal for
 * |n| <= 1077, the first product is exact (p is within [0.7, 1.5]) and the second rounds once.
 * A NaN x gives a NaN p; its n is garbage, but any scale keeps p's NaN (first operand). */
static inline __m256d exp_pd(__m256d x)
{
    x          = _mm256_min_pd(_mm256_set1_pd(746.0), _mm256_max_pd(_mm256_set1_pd(-746.0), x));
    __m256d n  = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r  = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93147180369123816490e-01), x);
    r          = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), r);
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
    __m256d p = _mm256_set1_pd(inv_fact[13]);
    for (int k = 12; k >= 0; k--) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(inv_fact[k]));
    __m128i ni = _mm256_cvtpd_epi32(n);
    __m128i a  = _mm_srai_epi32(ni, 1);
    return _mm256_mul_pd(_mm256_mul_pd(p, pow2_pd(a)), pow2_pd(_mm_sub_epi32(ni, a)));
}

static inline __m256d rf32_pd(__m256d x)
{
    return _mm256_cvtps_pd(_mm256_cvtpd_ps(x));
}

/* 4 lanes of the reference expert's h = f32(w * f32(f32(gg * (1 / (1 + exp(-gg)))) * vv)). */
static inline __m256d swiglu4(__m256d gg, __m256d vv, __m256d wd, __m256d lim, bool clamp)
{
    __m256d one = _mm256_set1_pd(1.0);
    if (clamp) {
        vv = _mm256_min_pd(_mm256_max_pd(vv, _mm256_sub_pd(_mm256_setzero_pd(), lim)), lim);
        gg = _mm256_min_pd(gg, lim);
    }
    __m256d e = exp_pd(_mm256_sub_pd(_mm256_setzero_pd(), gg));
    __m256d h = rf32_pd(_mm256_mul_pd(rf32_pd(_mm256_mul_pd(gg, _mm256_div_pd(one, _mm256_add_pd(one, e)))), vv));
    return _mm256_mul_pd(wd, h);
}

void dsv4_avx2_swiglu_bf16(float *g, const float *v, int n, float w, double limit)
{
    /* g[i] = bf16(f32(w * f32(f32(gg * (1 / (1 + exp(-gg)))) * vv))), gg and vv clamped to
     * limit when it is positive: the reference expert's expression and rounding points */
    __m256d lim = _mm256_set1_pd(limit), wd = _mm256_set1_pd((double)w);
    bool    clamp = limit > 0;
    int     i     = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i), vv = _mm256_loadu_ps(v + i);
        __m256d h0 = swiglu4(lo_pd(gv), lo_pd(vv), wd, lim, clamp);
        __m256d h1 = swiglu4(hi_pd(gv), hi_pd(vv), wd, lim, clamp);
        _mm256_storeu_ps(g + i, bf16_of_pd(h0, h1));
    }
    for (; i < n; i++) {
        double gg = g[i], vv = v[i];
        if (clamp) {
            vv = fmin(fmax(vv, -limit), limit);
            gg = fmin(gg, limit);
        }
        double h = (double)(float)((double)(float)(gg * (1.0 / (1.0 + exp(-gg)))) * vv);
        h        = (double)(float)((double)w * h);
        g[i]     = dsv4_round_bf16((float)h);
    }
}

/* ------------------------------------------------------------------ FP8 */

/* v (already divided by its power-of-two block scale) rounded to the nearest e4m3 value, as
 * the codec does lane by lane: ties to even, multiples of 2^-9 below 2^-6, saturation at 448,
 * NaN to 448 (MINPS returns its second operand for a NaN, as fminf returns the number). */
static inline __m256 e4m3_round(__m256 v)
{
    __m256 a  = abs_ps(v);
    /* subnormal codes: multiples of 2^-9, ties to even */
    __m256 rs = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                              _mm256_set1_ps(1.0f / 512.0f));
    /* normal: 3 mantissa bits, ties to even, on the float's bits */
    __m256i u = _mm256_castps_si256(a);
    u = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1)))),
                         _mm256_set1_epi32((int)0xfff00000u));
    __m256 r = _mm256_blendv_ps(_mm256_castsi256_ps(u), rs, _mm256_cmp_ps(a, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ));
    r        = _mm256_min_ps(r, _mm256_set1_ps(448.0f));
    return _mm256_or_ps(r, _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
}

/* The e4m3 block scale dsv4_act_scale(amax, 448, 1e-4), inline for finite amax (the product
 * is then a normal float); an infinite amax takes the codec's own rule. */
static inline float e4m3_block_scale(float amax)
{
    if (!(amax >= 1e-4f)) amax = 1e-4f;
    if (!(amax < INFINITY)) return dsv4_act_scale(amax, 448.0f, 1e-4f);
    return dsv4_pow2_ceil_normal(amax * (1.0f / 448.0f));
}

void dsv4_avx2_fp8_sim_rows(float *x, int n, int d, int ld, int block)
{
    const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * (size_t)ld;
        for (int b = 0; b < d; b += block) {
            __m256 m = _mm256_setzero_ps();
            for (int i = b; i < b + block; i += 8) m = _mm256_max_ps(abs_ps(_mm256_loadu_ps(row + i)), m);
            __m256 s = _mm256_set1_ps(e4m3_block_scale(hmax(m)));
            for (int i = b; i < b + block; i += 8) {
                __m256 v = _mm256_loadu_ps(row + i);
                __m256 q = round_bf16(_mm256_mul_ps(e4m3_round(_mm256_div_ps(v, s)), s));
                /* NaN becomes the codec's NaN code 0x7f, which decodes to the default +qNaN */
                _mm256_storeu_ps(row + i, _mm256_blendv_ps(q, qnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
            }
        }
    }
}

/* The activation quantiser of the f32 levels, the plain C quantise_row of ops_fast.c lane by
 * lane: amax ignoring NaN, s = dsv4_act_scale(amax, 448, 1e-4), q = e4m3(x * (1 / s)) * s
 * (1 / s is exact: s is a power of two in [2^-23, 2^120]); the short last block's tail in
 * the same expressions in scalar code. */
static inline float e4m3_round1(float v)
{
    return _mm_cvtss_f32(_mm256_castps256_ps128(e4m3_round(_mm256_set1_ps(v))));
}

void dsv4_avx2_quant_f32(const float *x, int n, float *out)
{
    for (int b = 0; b < n; b += 128) {
        int    e = b + 128 < n ? b + 128 : n, full = b + (e - b) / 8 * 8, k;
        __m256 m = _mm256_setzero_ps();
        for (k = b; k < full; k += 8) m = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + k)), m);
        float amax = hmax(m);
        for (; k < e; k++) {
            float a = fabsf(x[k]);
            amax    = a > amax ? a : amax;
        }
        float  s = dsv4_act_scale(amax, 448.0f, 1e-4f), inv = 1.0f / s;
        __m256 iv = _mm256_set1_ps(inv), sv = _mm256_set1_ps(s);
        for (k = b; k < full; k += 8)
            _mm256_storeu_ps(out + k, _mm256_mul_ps(e4m3_round(_mm256_mul_ps(_mm256_loadu_ps(x + k), iv)), sv));
        for (; k < e; k++) out[k] = e4m3_round1(x[k] * inv) * s;
    }
}

/* ------------------------------------------------------------------ RMSNorm */

/* sum of x[i]^2 in double (each square exact) */
static double sumsq_pd(const float *x, int d)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd(), a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
    int     i  = 0;
    for (; i + 16 <= d; i += 16) {
        __m256 u = _mm256_loadu_ps(x + i), v = _mm256_loadu_ps(x + i + 8);
        __m256d p = lo_pd(u), q = hi_pd(u), r = lo_pd(v), s = hi_pd(v);
        a0 = _mm256_fmadd_pd(p, p, a0);
        a1 = _mm256_fmadd_pd(q, q, a1);
        a2 = _mm256_fmadd_pd(r, r, a2);
        a3 = _mm256_fmadd_pd(s, s, a3);
    }
    double s = hsum_pd(_mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
    for (; i < d; i++) s += (double)x[i] * x[i];
    return s;
}

void dsv4_avx2_rmsnorm_row(const float *x, int d, const uint16_t *w, double eps, float *y)
{
    double  ss  = sumsq_pd(x, d);
    double  inv = 1.0 / sqrt((double)(float)(ss / d) + eps);
    __m256d iv  = _mm256_set1_pd(inv);
    int     i   = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        __m256 wf = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i))), 16));
        __m256d y0 = _mm256_mul_pd(lo_pd(wf), _mm256_mul_pd(lo_pd(xv), iv));
        __m256d y1 = _mm256_mul_pd(hi_pd(wf), _mm256_mul_pd(hi_pd(xv), iv));
        _mm256_storeu_ps(y + i, bf16_of_pd(y0, y1));
    }
    for (; i < d; i++) y[i] = dsv4_round_bf16((float)((double)dsv4_f32_from_bf16(w[i]) * ((double)x[i] * inv)));
}

/* ------------------------------------------------------------------ RoPE */

/* RoPE of one row's n_vec vectors: c[i], s[i] (f32 values in double) for the half = d_rope/2
 * pairs; each pair (a, b) -> bf16(a c - b s), bf16(a s + b c) in double (no fused multiply-add,
 * as the reference, built with -ffp-contract=off by -std=c11). */
void dsv4_avx2_rope_row(float *x, int n_vec, int d_full, int d_rope, const double *c, const double *s)
{
    int           half = d_rope / 2;
    const __m256i deil = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7); /* a0..a3 | b0..b3 */
    for (int v = 0; v < n_vec; v++) {
        float *xr = x + (size_t)v * (size_t)d_full + (size_t)(d_full - d_rope);
        int    i  = 0;
        for (; i + 4 <= half; i += 4) {
            __m256  p  = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xr + 2 * i), deil); /* 4 pairs */
            __m256d a = lo_pd(p), b = hi_pd(p);
            __m256d cv = _mm256_loadu_pd(c + i), sv = _mm256_loadu_pd(s + i);
            __m128  ya = _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_mul_pd(a, cv), _mm256_mul_pd(b, sv)));
            __m128  yb = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(a, sv), _mm256_mul_pd(b, cv)));
            __m256  y  = _mm256_set_m128(_mm_unpackhi_ps(ya, yb), _mm_unpacklo_ps(ya, yb));
            _mm256_storeu_ps(xr + 2 * i, round_bf16(y));
        }
        for (; i < half; i++) {
            double a = xr[2 * i], b = xr[2 * i + 1];
            xr[2 * i]     = dsv4_round_bf16((float)(a * c[i] - b * s[i]));
            xr[2 * i + 1] = dsv4_round_bf16((float)(a * s[i] + b * c[i]));
        }
    }
}

/* ------------------------------------------------------------------ Hadamard */

/* The butterflies of stride len < 4 inside one register of 4 doubles: lane j pairs with
 * j ^ len; the lower lane gets a + b, the upper a - b (the same two operations on the same
 * values as the reference's loop, whatever the order the pairs are visited in). */
static inline __m256d butterfly_in(__m256d v, int len)
{
    if (len == 1) {
        __m256d sw = _mm256_permute_pd(v, 0x5);
        return _mm256_blend_pd(_mm256_add_pd(v, sw), _mm256_sub_pd(sw, v), 0xa);
    }
    __m256d sw = _mm256_permute2f128_pd(v, v, 0x01);
    return _mm256_blend_pd(_mm256_add_pd(v, sw), _mm256_sub_pd(sw, v), 0xc);
}

void dsv4_avx2_hadamard_rows(float *x, int n, int d)
{
    /* d: a power of two, 8 <= d <= 4096 (32 KiB of doubles on the stack) */
    __m256d v[1024];
    double  scale = 1.0 / sqrt((double)d);
    int     nv    = d / 4;
    for (int r = 0; r < n; r++) {
        float *xr = x + (size_t)r * (size_t)d;
        for (int k = 0; k < nv; k += 2) {
            __m256 f = _mm256_loadu_ps(xr + 4 * k);
            v[k]     = butterfly_in(butterfly_in(lo_pd(f), 1), 2);
            v[k + 1] = butterfly_in(butterfly_in(hi_pd(f), 1), 2);
        }
        for (int lv = 1; lv < nv; lv *= 2)
            for (int k = 0; k < nv; k += 2 * lv)
                for (int j = k; j < k + lv; j++) {
                    __m256d a = v[j], b = v[j + lv];
                    v[j]      = _mm256_add_pd(a, b);
                    v[j + lv] = _mm256_sub_pd(a, b);
                }
        __m256d sc = _mm256_set1_pd(scale);
        for (int k = 0; k < nv; k += 2) _mm256_storeu_ps(xr + 4 * k, bf16_of_pd(_mm256_mul_pd(v[k], sc), _mm256_mul_pd(v[k + 1], sc)));
    }
}

/* ------------------------------------------------------------------ data ops (ops_data.c) */

void dsv4_avx2_bf16_to_f32(const uint16_t *h, size_t n, float *x)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i))), 16)));
    for (; i < n; i++) x[i] = dsv4_f32_from_bf16(h[i]);
}

void dsv4_avx2_scale_rows(float *x, size_t n, double s)
{
    __m256d sv = _mm256_set1_pd(s);
    size_t  i  = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(x + i, bf16_of_pd(_mm256_mul_pd(lo_pd(v), sv), _mm256_mul_pd(hi_pd(v), sv)));
    }
    for (; i < n; i++) x[i] = dsv4_round_bf16((float)(x[i] * s));
}

void dsv4_avx2_add_rows(float *x, const float *e, size_t n)
{
    /* in double, then f32: a sum of two floats rounded straight to f32 could differ (double
     * rounding) where their exponents are far apart */
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(e + i);
        _mm256_storeu_ps(x + i, bf16_of_pd(_mm256_add_pd(lo_pd(v), lo_pd(w)), _mm256_add_pd(hi_pd(v), hi_pd(w))));
    }
    for (; i < n; i++) x[i] = dsv4_round_bf16((float)((double)x[i] + e[i]));
}

void dsv4_avx2_combine_row(int k, int d, const int *p, const float *ye, const float *sh, float *f)
{
    /* each lane sums its column from 0 in the pairs' order, as the plain C loop */
    int i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
        for (int s = 0; s < k; s++) {
            __m256 y = _mm256_loadu_ps(ye + (size_t)p[s] * (size_t)d + (size_t)i);
            a0       = _mm256_add_pd(a0, lo_pd(y));
            a1       = _mm256_add_pd(a1, hi_pd(y));
        }
        __m256 h = _mm256_loadu_ps(sh + i);
        _mm256_storeu_ps(f + i, bf16_of_pd(_mm256_add_pd(a0, lo_pd(h)), _mm256_add_pd(a1, hi_pd(h))));
    }
    for (; i < d; i++) {
        double acc = 0;
        for (int s = 0; s < k; s++) acc += ye[(size_t)p[s] * (size_t)d + (size_t)i];
        f[i] = dsv4_round_bf16((float)(acc + sh[i]));
    }
}
