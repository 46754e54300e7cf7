/*
 * x86_avx512bf16_attn.c - sink attention and indexer scores of one query on VDPBF16PS.
 *
 * Both are two small matrix products per query: scores = Q . K^T over the heads, then
 * O = P . V (attention) or a weighted sum over the heads (indexer). Every operand is exactly
 * a bf16: the query after its RMS norm and RoPE (rounded to bf16 in the model), cached rows
 * (e4m3 codes times a power of two, bf16 RoPE dims), FP4-simulated indexer queries and keys,
 * and the probabilities, which the model rounds to bf16 for P.V. So VDPBF16PS computes the
 * same products as the f32 path, with f32 sums in another order.
 *
 * Heads sit in the lanes: a head group of 16 heads is one register. For the scores the query
 * is laid out once as [d/2][16 heads][2] (qp) and each cached row, decoded to bf16 once per
 * query (kr), is broadcast one dimension pair at a time; 2 head groups x 12 rows of
 * accumulators. For P.V the probabilities are written as [rows/2][16 heads][2] (pp) and the
 * rows as pairs [rows/2][d][2] (vp), so a broadcast value pair of one dimension meets the
 * probabilities of both rows; 2 head groups x 8 dimensions of accumulators. Nothing depends
 * on other queries, so a query's result is the same at any chunk or batch size.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/x86_bf16_conv.h"

enum { SC_NR = 12, PV_ND = 8 };

/* e^x for x <= 0 (and moderately positive x): 2^n * p(r), r = x - n ln2, |r| <= ln2/2,
 * Taylor polynomial of degree 7 (relative error ~1e-8 before rounding), scaled by VSCALEFPS,
 * which takes results down through the subnormals to zero. */
static inline __m512 exp512(__m512 x)
{
    x          = _mm512_max_ps(_mm512_set1_ps(-110.0f), x); /* constant first: a NaN passes */
    __m512 n   = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r   = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r          = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p   = _mm512_set1_ps(1.0f / 5040);
    p          = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p          = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p          = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p          = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p          = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p          = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p          = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* f32 -> bf16 (round to nearest even) -> f32, 16 lanes. */
static inline __m512 round_bf16(__m512 x)
{
    __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 32 bf16 times a power of two (an f32 scale), back to bf16: exact for normal results. */
static inline __m512i scale_bf16(__m512i v, float s)
{
    __m512 sc = _mm512_set1_ps(s);
    __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
    __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, sc), _mm512_mul_ps(lo, sc));
}

/* Dimensions [d, d + 32) of a cached row as bf16 (row formats of ref_quant.c). */
static inline __m512i row_bf16(enum dsv4_row_fmt fmt, int d_head, int d_rope, const uint8_t *row, int d)
{
    if (fmt == DSV4_ROW_BF16) return _mm512_loadu_si512(row + 2 * (size_t)d);
    int d_nope = d_head - d_rope;
    if (d >= d_nope) return _mm512_loadu_si512(row + d_nope + d_nope / 64 + 2 * (size_t)(d - d_nope));
    return scale_bf16(e4m3_bf16(row + d), dsv4_f32_from_e8m0(row[d_nope + d / 64]));
}

/* The query of head group g as [d/2][16][2] bf16; heads past n_head are zero. */
static void query_panel(const float *q, int n_head, int d, int g, uint16_t *qp)
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(16));
    for (int j = 0; j < 16; j++) {
        int h = g * 16 + j;
        for (int i = 0; i < d; i += 32) {
            __m512i v = _mm512_setzero_si512();
            if (h < n_head) {
                const float *qh = q + (size_t)h * (size_t)d + i;
                v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qh + 16), _mm512_loadu_ps(qh));
            }
            /* pair i/2 + k of head j goes to u32 slot ((i/2 + k) * 16 + j) */
            _mm512_i32scatter_epi32((int *)qp + (size_t)(i / 2) * 16 + j, idx, v, 4);
        }
    }
}

/* s[g][r][16] = scale * (q_g . kr[r]) for head groups g0, g0 + ng - 1 (ng 1 or 2), rows [r0, r0 + SC_NR). */
static inline __attribute__((always_inline)) void score_tile(int ng, const uint16_t *qp0, const uint16_t *qp1,
                                                             const uint16_t *kr, int d, float scale, float *s0,
                                                             float *s1)
{
    __m512 acc0[SC_NR], acc1[SC_NR];
    for (int r = 0; r < SC_NR; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    const uint32_t *k32 = (const uint32_t *)kr;
    for (int i = 0; i < d / 2; i++) {
        __m512bh a0 = as_bh(_mm512_loadu_si512(qp0 + (size_t)i * 32));
        __m512bh a1 = ng > 1 ? as_bh(_mm512_loadu_si512(qp1 + (size_t)i * 32)) : a0;
#pragma GCC unroll 12
        for (int r = 0; r < SC_NR; r++) {
            __m512bh b = as_bh(_mm512_set1_epi32((int)k32[(size_t)r * (size_t)(d / 2) + (size_t)i]));
            acc0[r]    = _mm512_dpbf16_ps(acc0[r], a0, b);
            if (ng > 1) acc1[r] = _mm512_dpbf16_ps(acc1[r], a1, b);
        }
    }
    __m512 sc = _mm512_set1_ps(scale);
    for (int r = 0; r < SC_NR; r++) {
        _mm512_storeu_ps(s0 + 16 * r, _mm512_mul_ps(acc0[r], sc));
        if (ng > 1) _mm512_storeu_ps(s1 + 16 * r, _mm512_mul_ps(acc1[r], sc));
    }
}

static void scores(int ng, const uint16_t *qp0, const uint16_t *qp1, const uint16_t *kr, int n_pad, int d, float scale,
                   float *s0, float *s1)
{
    for (int r0 = 0; r0 < n_pad; r0 += SC_NR) {
        const uint16_t *k = kr + (size_t)r0 * (size_t)d;
        if (ng > 1) score_tile(2, qp0, qp1, k, d, scale, s0 + 16 * (size_t)r0, s1 + 16 * (size_t)r0);
        else score_tile(1, qp0, qp0, k, d, scale, s0 + 16 * (size_t)r0, s0 + 16 * (size_t)r0);
    }
}

/* ------------------------------------------------------------------ attention */

void dsv4_avx512bf16_attn_rows(const struct dsv4_attn_bf16 *a, int p0, int p1)
{
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                        37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    int           D  = a->d_head;
    for (int p = p0; p < p1; p++) {
        int             r    = 2 * p;
        const uint8_t  *ra   = r < a->n_rows ? a->rows[r] : NULL, *rb = r + 1 < a->n_rows ? a->rows[r + 1] : NULL;
        uint16_t       *ka   = a->kr + (size_t)r * (size_t)D, *kb = ka + D;
        uint16_t       *vp   = a->vp + (size_t)p * 2 * (size_t)D;
        for (int d = 0; d < D; d += 32) {
            __m512i x = ra ? row_bf16(a->fmt, D, a->d_rope, ra, d) : _mm512_setzero_si512();
            __m512i y = rb ? row_bf16(a->fmt, D, a->d_rope, rb, d) : _mm512_setzero_si512();
            _mm512_storeu_si512(ka + d, x);
            _mm512_storeu_si512(kb + d, y);
            _mm512_storeu_si512(vp + 2 * (size_t)d, _mm512_permutex2var_epi16(x, lo, y));
            _mm512_storeu_si512(vp + 2 * (size_t)d + 32, _mm512_permutex2var_epi16(x, hi, y));
        }
    }
}

/* Softmax of head group g over the n rows of s (layout [n_pad][16]): probabilities as bf16
 * row pairs into pp, denominators (sink included, unrounded exponentials summed in row
 * order) into den. */
static void softmax_group(const struct dsv4_attn_bf16 *a, int g, const float *s, uint16_t *pp, float *den)
{
    const __m512i ilv = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    int      n  = a->n_rows, npad = a->n_pad;
    __m512   mx = _mm512_set1_ps(-INFINITY);
    for (int r = 0; r < n; r++) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + 16 * (size_t)r));
    __m512 sum = _mm512_setzero_ps();
    for (int r = 0; r < npad; r += 2) {
        __m512 e0 = _mm512_setzero_ps(), e1 = _mm512_setzero_ps();
        if (r < n) {
            e0  = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * (size_t)r), mx));
            sum = _mm512_add_ps(sum, e0);
        }
        if (r + 1 < n) {
            e1  = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * (size_t)(r + 1)), mx));
            sum = _mm512_add_ps(sum, e1);
        }
        /* [e0 heads 0-15 | e1 heads 0-15] as bf16, interleaved to head-major pairs */
        __m512i both = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
        _mm512_storeu_si512(pp + (size_t)r * 16, _mm512_permutexvar_epi16(ilv, both));
    }
    float sk[16] = { 0 };
    for (int j = 0; j < 16 && g * 16 + j < a->n_head; j++) sk[j] = a->sink[g * 16 + j];
    __m512 es = exp512(_mm512_sub_ps(_mm512_loadu_ps(sk), mx));
    _mm512_storeu_ps(den, _mm512_add_ps(sum, es));
}

/* o for head groups g0 and g0 + ng - 1, dimensions [d0, d0 + PV_ND). */
static inline __attribute__((always_inline)) void pv_tile(int ng, const struct dsv4_attn_bf16 *a, const uint16_t *pp0,
                                                          const uint16_t *pp1, const float *den0, const float *den1,
                                                          int g0, int d0)
{
    __m512 acc0[PV_ND], acc1[PV_ND];
    for (int k = 0; k < PV_ND; k++) acc0[k] = acc1[k] = _mm512_setzero_ps();
    int             D   = a->d_head;
    const uint32_t *v32 = (const uint32_t *)a->vp + d0;
    for (int p = 0; p < a->n_pad / 2; p++) {
        __m512bh x0 = as_bh(_mm512_loadu_si512(pp0 + (size_t)p * 32));
        __m512bh x1 = ng > 1 ? as_bh(_mm512_loadu_si512(pp1 + (size_t)p * 32)) : x0;
        const uint32_t *v = v32 + (size_t)p * (size_t)D;
#pragma GCC unroll 8
        for (int k = 0; k < PV_ND; k++) {
            __m512bh b = as_bh(_mm512_set1_epi32((int)v[k]));
            acc0[k]    = _mm512_dpbf16_ps(acc0[k], x0, b);
            if (ng > 1) acc1[k] = _mm512_dpbf16_ps(acc1[k], x1, b);
        }
    }
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(D));
    for (int gi = 0; gi < ng; gi++) {
        int       g    = g0 + gi;
        int       left = a->n_head - g * 16;
        __mmask16 m    = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        __m512    dn   = _mm512_loadu_ps(gi ? den1 : den0);
        float    *o    = a->o + (size_t)g * 16 * (size_t)D + d0;
        for (int k = 0; k < PV_ND; k++)
            _mm512_mask_i32scatter_ps(o + k, m, idx, round_bf16(_mm512_div_ps(gi ? acc1[k] : acc0[k], dn)), 4);
    }
}

void dsv4_avx512bf16_attn_heads(const struct dsv4_attn_bf16 *a, int u0, int u1)
{
    int G = (a->n_head + 15) / 16, D = a->d_head;
    for (int u = u0; u < u1; u++) {
        int       g0 = 2 * u, ng = g0 + 1 < G ? 2 : 1;
        uint16_t *qp[2];
        float    *s[2], *den[2];
        uint16_t *pp[2];
        for (int i = 0; i < ng; i++) {
            int g  = g0 + i;
            qp[i]  = a->qp + (size_t)g * 16 * (size_t)D;
            s[i]   = a->s + (size_t)g * 16 * (size_t)a->n_pad;
            pp[i]  = a->pp + (size_t)g * 16 * (size_t)a->n_pad;
            den[i] = a->den + 16 * g;
            query_panel(a->q, a->n_head, D, g, qp[i]);
        }
        if (ng == 1) qp[1] = qp[0], s[1] = s[0], pp[1] = pp[0], den[1] = den[0];
        scores(ng, qp[0], qp[1], a->kr, a->n_pad, D, a->scale, s[0], s[1]);
        for (int i = 0; i < ng; i++) softmax_group(a, g0 + i, s[i], pp[i], den[i]);
        for (int d0 = 0; d0 < D; d0 += PV_ND) {
            if (ng > 1) pv_tile(2, a, pp[0], pp[1], den[0], den[1], g0, d0);
            else pv_tile(1, a, pp[0], pp[0], den[0], den[0], g0, d0);
        }
    }
}

/* ------------------------------------------------------------------ indexer */

/* Keys [k0, k1) as bf16 rows of kr (zero past the last key). */
static void idx_decode(const struct dsv4_idx_bf16 *x, int k0, int k1, uint16_t *kr)
{
    int d = x->d, kbytes = dsv4_idx_key_bytes(d);
    for (int j = k0; j < k1; j++) {
        uint16_t *out = kr + (size_t)(j - k0) * (size_t)d;
        if (j >= x->n_keys) {
            memset(out, 0, sizeof(uint16_t) * (size_t)d);
            continue;
        }
        const uint8_t *row = x->blocks[j / x->block_keys] + (size_t)(j % x->block_keys) * (size_t)kbytes;
        for (int i = 0; i < d; i += 32)
            _mm512_storeu_si512(out + i, scale_bf16(e2m1_bf16(row + i / 2), dsv4_f32_from_e8m0(row[d / 2 + i / 32])));
    }
}

void dsv4_avx512bf16_idx_query(const struct dsv4_idx_bf16 *x)
{
    for (int g = 0; g < (x->n_head + 15) / 16; g++) query_panel(x->q, x->n_head, x->d, g, x->qp + (size_t)g * 16 * (size_t)x->d);
}

void dsv4_avx512bf16_idx_keys(const struct dsv4_idx_bf16 *x, int b0, int b1, float *s)
{
    int G = (x->n_head + 15) / 16, d = x->d;
    for (int b = b0; b < b1; b++) {
        int       k0 = b * SC_NR;
        uint16_t *kr = (uint16_t *)(s + (size_t)(G + 1) / 2 * 32 * SC_NR);
        idx_decode(x, k0, k0 + SC_NR, kr);
        /* s[g][r][16]: raw dot products of this block's rows */
        for (int g = 0; g < G; g += 2) {
            const uint16_t *q0 = x->qp + (size_t)g * 16 * (size_t)d;
            float          *s0 = s + (size_t)g * 16 * SC_NR;
            if (g + 1 < G) score_tile(2, q0, q0 + 16 * (size_t)d, kr, d, 1.0f, s0, s0 + 16 * SC_NR);
            else score_tile(1, q0, q0, kr, d, 1.0f, s0, s0);
        }
        for (int r = 0; r < SC_NR && k0 + r < x->n_keys; r++) {
            __m512 tot = _mm512_setzero_ps();
            for (int g = 0; g < G; g++) {
                int       left = x->n_head - g * 16;
                __mmask16 m    = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
                __m512    dot  = _mm512_max_ps(round_bf16(_mm512_loadu_ps(s + ((size_t)g * SC_NR + (size_t)r) * 16)),
                                               _mm512_setzero_ps());
                __m512    w    = _mm512_maskz_loadu_ps(m, x->w + 16 * g);
                tot            = _mm512_add_ps(tot, round_bf16(_mm512_mul_ps(dot, w)));
            }
            __m512 t = round_bf16(_mm512_set1_ps(_mm512_reduce_add_ps(tot)));
            x->score[k0 + r] = _mm512_cvtss_f32(t);
        }
    }
}
