/*
 * x86_fp4_exact512.c - the avx512-int sub-level's FP4 projections: fp4_exact.h's numerics
 * (the same bits as avx2-int) on 512-bit vectors, two rows per vector. A zmm holds row r's
 * eight lanes in its lower half and row r + 1's in its upper half, against the token's
 * activations broadcast to both halves, so every lane computes exactly what the ymm kernels
 * compute for it, and the halves are summed by the same fixed tree. Compiled with the avx512
 * level's flags (F/BW/VL/DQ); the VNNI variant by target attribute; only after the CPU check.
 *
 * GEMV (fewer than gmin tokens): per 32 weights and two rows, 6 operations to decode and 6 per
 * token with VPDPWSSD (VPMADDWD, 3 VPDPWSSD, CVT, FMA), or 9 without VNNI. GEMM: the f32 route
 * of x86_fp4_exact.c with two rows per vector, 5 FP operations per 4 products and lane.
 * The last (o1 - o0) mod 4 rows go to the ymm GEMV (the same bits).
 */
#include <limits.h>
#include <stdbool.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/fp4_exact.h"
#include "backend/cpu/x86_fp4_exact.h"

/* Rows r (p0) and r + 1 (p1), one 32-block each -> W0, W1 as i4_dec's w0, w1 of row r in the
 * lower 256 bits and of row r + 1 in the upper: the 128-bit lanes hold [p0 p0 p1 p1], the
 * second and fourth shifted by 4 (the odd nibbles). */
INL void z_dec(const uint8_t *p0, const uint8_t *p1, __m512i *w0, __m512i *w1)
{
    const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
    __m256i       b0  = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p0));
    __m256i       b1  = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p1));
    __m512i       b   = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
    __m512i       n   = _mm512_and_si512(_mm512_srlv_epi32(b, _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4)),
                                         _mm512_set1_epi8(15));
    __m512i       v   = _mm512_shuffle_epi8(tab, n);
    *w0               = _mm512_unpacklo_epi8(_mm512_setzero_si512(), v);
    *w1               = _mm512_unpackhi_epi8(_mm512_setzero_si512(), v);
}

struct z_w {
    __m512i w0, w1, u0, u1;
};

INL struct z_w z_load(const uint8_t *p0, const uint8_t *p1)
{
    struct z_w r;
    z_dec(p0, p1, &r.w0, &r.w1);
    r.u0 = _mm512_srai_epi16(r.w0, 8);
    r.u1 = _mm512_srai_epi16(r.w1, 8);
    return r;
}

/* One token's [H0 H1 L0 L1] of a block, each broadcast to both halves. */
struct z_h {
    __m512i h0, h1, l0, l1;
};

INL struct z_h z_act(const __m256i *h)
{
    struct z_h r = { _mm512_broadcast_i64x4(_mm256_loadu_si256(h)), _mm512_broadcast_i64x4(_mm256_loadu_si256(h + 1)),
                     _mm512_broadcast_i64x4(_mm256_loadu_si256(h + 2)), _mm512_broadcast_i64x4(_mm256_loadu_si256(h + 3)) };
    return r;
}

INL __m512i z_dot_bw(const struct z_w *w, const struct z_h *h)
{
    __m512i hi = _mm512_add_epi32(_mm512_madd_epi16(w->w0, h->h0), _mm512_madd_epi16(w->w1, h->h1));
    __m512i lo = _mm512_add_epi32(_mm512_madd_epi16(w->u0, h->l0), _mm512_madd_epi16(w->u1, h->l1));
    return _mm512_add_epi32(hi, lo);
}

__attribute__((target("avx512vnni"))) INL __m512i z_dot_vnni(const struct z_w *w, const struct z_h *h)
{
    __m512i acc = _mm512_madd_epi16(w->u0, h->l0);
    acc         = _mm512_dpwssd_epi32(acc, w->u1, h->l1);
    acc         = _mm512_dpwssd_epi32(acc, w->w0, h->h0);
    return _mm512_dpwssd_epi32(acc, w->w1, h->h1);
}

/* The block scales of rows r (lower half) and r + 1 (upper) for one token: tp is the token's
 * row of the table, e0 and e1 the rows' e8m0 bytes. */
INL __m512 z_scale(const float *tp, uint8_t e0, uint8_t e1)
{
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(tp[e0]), 0xff00, _mm_load_ss(tp + e1));
}

/* Row r's and r + 1's outputs from a pair accumulator: each half by fp4_exact.h's tree. */
INL void z_store2(__m512 acc, float *y0, float *y1)
{
    *y0 = i4_hsum(_mm512_castps512_ps256(acc));
    *y1 = i4_hsum(_mm512_extractf32x8_ps(acc, 1));
}

/* The GEMV: rows ow..ow+3 (two pairs) against NT (<= 4) tokens. */
#define Z_ROWS(NAME, DOT, TGT)                                                                                     \
    TGT INL void NAME(const struct dsv4_linear *w, int NT, int ow, const float *x, int ldx, float *y, int ldy, int o) \
    {                                                                                                              \
        int            K = w->n_in, nb = K / 32;                                                                   \
        const uint8_t *wr[4], *er[4];                                                                              \
        const __m256i *A[4];                                                                                       \
        const int32_t *E[4];                                                                                       \
        __m512         acc[2][4];                                                                                  \
        for (int r = 0; r < 4; r++) {                                                                              \
            wr[r] = (const uint8_t *)w->w + (size_t)(ow + r) * (size_t)(K / 2);                                    \
            er[r] = (const uint8_t *)w->scale + (size_t)(ow + r) * (size_t)nb;                                     \
        }                                                                                                          \
        for (int t = 0; t < NT; t++) {                                                                             \
            A[t]      = (const __m256i *)(const void *)(x + (size_t)t * (size_t)ldx);                              \
            E[t]      = (const int32_t *)(const void *)(x + (size_t)t * (size_t)ldx + dsv4_fp4x_e_off(K));         \
            acc[0][t] = acc[1][t] = _mm512_setzero_ps();                                                           \
        }                                                                                                          \
        for (int b = 0; b < nb; b++) {                                                                             \
            i4_prefetch4(w, ow, b * 32);                                                                           \
            struct z_w wd[2] = { z_load(wr[0] + (size_t)b * 16, wr[1] + (size_t)b * 16),                           \
                                 z_load(wr[2] + (size_t)b * 16, wr[3] + (size_t)b * 16) };                         \
            for (int t = 0; t < NT; t++) {                                                                         \
                const float *tp = dsv4_fp4x_sc + DSV4_FP4X_SC_OFF + E[t][b];                                   \
                struct z_h   h  = z_act(A[t] + (size_t)b * 4);                                                     \
                for (int p = 0; p < 2; p++)                                                                        \
                    acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(DOT(&wd[p], &h)),                               \
                                                z_scale(tp, er[2 * p][b], er[2 * p + 1][b]), acc[p][t]);           \
            }                                                                                                      \
        }                                                                                                          \
        for (int t = 0; t < NT; t++)                                                                               \
            for (int p = 0; p < 2; p++)                                                                            \
                z_store2(acc[p][t], &y[(size_t)t * (size_t)ldy + (size_t)(o + 2 * p)],                             \
                         &y[(size_t)t * (size_t)ldy + (size_t)(o + 2 * p + 1)]);                                   \
    }

#define TGT_PLAIN
#define TGT_VNNI __attribute__((target("avx512vnni")))
Z_ROWS(z_rows_bw, z_dot_bw, TGT_PLAIN)
Z_ROWS(z_rows_vnni, z_dot_vnni, TGT_VNNI)

/* ------------------------------------------------------------------ the GEMM route */

enum { Z_KC = 256, Z_TG = 24, Z_TN = 4 };

/* w2 of rows ow..ow+3 as f32, inputs [k0, k1): pair p's block i at p[(p * Z_KC / 32 + i) * 64],
 * vectors j = 0..3 of 16 floats (row 2p's F-order vector j, then row 2p + 1's); the rows' scale
 * bytes into e[r * 8 + i]. */
INL void z_decode4(const struct dsv4_linear *w, int ow, int k0, int k1, float *p, uint8_t *e)
{
    int nb = w->n_in / 32;
    for (int kb = k0; kb < k1; kb += 32) {
        int i = (kb - k0) / 32;
        i4_prefetch4(w, ow, kb);
        for (int q = 0; q < 2; q++) {
            const uint8_t *r0 = (const uint8_t *)w->w + ((size_t)(ow + 2 * q) * (size_t)w->n_in + (size_t)kb) / 2;
            __m512i        w0, w1;
            z_dec(r0, r0 + w->n_in / 2, &w0, &w1);
            float *d = p + (size_t)(q * Z_KC / 32 + i) * 64;
            _mm512_storeu_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w0, 16), 24)));
            _mm512_storeu_ps(d + 16, _mm512_cvtepi32_ps(_mm512_srai_epi32(w0, 24)));
            _mm512_storeu_ps(d + 32, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w1, 16), 24)));
            _mm512_storeu_ps(d + 48, _mm512_cvtepi32_ps(_mm512_srai_epi32(w1, 24)));
        }
        for (int r = 0; r < 4; r++) e[r * 8 + i] = ((const uint8_t *)w->scale)[(size_t)(ow + r) * (size_t)nb + (size_t)(kb / 32)];
    }
}

/* NT (<= Z_TN) tokens against the buffered rows, blocks [b0, b0 + n_b); acc[p * Z_TG + t]. */
INL void z_tile4(int NT, const float *p, const uint8_t *e, int b0, int n_b, int K, const float *x, int ldx, __m512 *acc)
{
    __m512 a[2][Z_TN];
    for (int q = 0; q < 2; q++)
        for (int t = 0; t < NT; t++) a[q][t] = acc[q * Z_TG + t];
    for (int i = 0; i < n_b; i++) {
        int b = b0 + i;
        for (int t = 0; t < NT; t++) {
            const float   *row = x + (size_t)t * (size_t)ldx;
            const float   *f   = row + dsv4_fp4x_f_off(K) + (size_t)b * 32;
            const int32_t *E   = (const int32_t *)(const void *)(row + dsv4_fp4x_e_off(K));
            const float   *tp  = dsv4_fp4x_sc + DSV4_FP4X_SC_OFF + E[b];
            __m512 x0 = _mm512_broadcast_f32x8(_mm256_loadu_ps(f)), x1 = _mm512_broadcast_f32x8(_mm256_loadu_ps(f + 8));
            __m512 x2 = _mm512_broadcast_f32x8(_mm256_loadu_ps(f + 16)), x3 = _mm512_broadcast_f32x8(_mm256_loadu_ps(f + 24));
            for (int q = 0; q < 2; q++) {
                const float *d = p + (size_t)(q * Z_KC / 32 + i) * 64;
                __m512       s = _mm512_mul_ps(_mm512_loadu_ps(d), x0);
                s              = _mm512_fmadd_ps(_mm512_loadu_ps(d + 16), x1, s);
                s              = _mm512_fmadd_ps(_mm512_loadu_ps(d + 32), x2, s);
                s              = _mm512_fmadd_ps(_mm512_loadu_ps(d + 48), x3, s);
                a[q][t]        = _mm512_fmadd_ps(s, z_scale(tp, e[2 * q * 8 + i], e[(2 * q + 1) * 8 + i]), a[q][t]);
            }
        }
    }
    for (int q = 0; q < 2; q++)
        for (int t = 0; t < NT; t++) acc[q * Z_TG + t] = a[q][t];
}

static void z_gemm(const struct dsv4_linear *w, int o0, int q1, int nt, const float *x, int ldx, float *y, int ldy)
{
    float   p[4 * Z_KC] __attribute__((aligned(64)));
    uint8_t e[4 * 8];
    __m512  acc[2 * Z_TG];
    int     K = w->n_in;
    for (int t0 = 0; t0 < nt; t0 += Z_TG) {
        int tn = nt - t0 < Z_TG ? nt - t0 : Z_TG;
        for (int o = o0; o < q1; o += 4) {
            int ow = o + w->row_off;
            for (int i = 0; i < 2 * Z_TG; i++) acc[i] = _mm512_setzero_ps();
            for (int k0 = 0; k0 < K; k0 += Z_KC) {
                int k1 = k0 + Z_KC < K ? k0 + Z_KC : K;
                z_decode4(w, ow, k0, k1, p, e);
                for (int t = 0; t < tn; t += Z_TN) {
                    const float *xt = x + (size_t)(t0 + t) * (size_t)ldx;
                    int          b0 = k0 / 32, n_b = (k1 - k0) / 32;
                    switch (tn - t < Z_TN ? tn - t : Z_TN) {
                    case 1: z_tile4(1, p, e, b0, n_b, K, xt, ldx, acc + t); break;
                    case 2: z_tile4(2, p, e, b0, n_b, K, xt, ldx, acc + t); break;
                    case 3: z_tile4(3, p, e, b0, n_b, K, xt, ldx, acc + t); break;
                    default: z_tile4(4, p, e, b0, n_b, K, xt, ldx, acc + t); break;
                    }
                }
            }
            for (int t = 0; t < tn; t++)
                for (int q = 0; q < 2; q++)
                    z_store2(acc[q * Z_TG + t], &y[(size_t)(t0 + t) * (size_t)ldy + (size_t)(o + 2 * q)],
                             &y[(size_t)(t0 + t) * (size_t)ldy + (size_t)(o + 2 * q + 1)]);
        }
    }
}

/* ------------------------------------------------------------------ entry points */

#define Z_DOT_ENTRY(NAME, ROWS, TGT)                                                                               \
    TGT void NAME(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,  \
                  int gmin)                                                                                        \
    {                                                                                                              \
        int q1 = o0 + (o1 - o0) / 4 * 4;                                                                           \
        if (nt >= gmin) z_gemm(w, o0, q1, nt, x, ldx, y, ldy);                                                     \
        else                                                                                                       \
            for (int o = o0; o < q1; o += 4)                                                                       \
                for (int t0 = 0; t0 < nt; t0 += 4) {                                                               \
                    const float *xt = x + (size_t)t0 * (size_t)ldx;                                                \
                    float       *yt = y + (size_t)t0 * (size_t)ldy;                                                \
                    int          ow = o + w->row_off;                                                              \
                    switch (nt - t0 < 4 ? nt - t0 : 4) {                                                           \
                    case 1: ROWS(w, 1, ow, xt, ldx, yt, ldy, o); break;                                            \
                    case 2: ROWS(w, 2, ow, xt, ldx, yt, ldy, o); break;                                            \
                    case 3: ROWS(w, 3, ow, xt, ldx, yt, ldy, o); break;                                            \
                    default: ROWS(w, 4, ow, xt, ldx, yt, ldy, o); break;                                           \
                    }                                                                                              \
                }                                                                                                  \
        if (q1 < o1) dsv4_fp4x_dot_avx2(w, q1, o1, nt, x, ldx, y, ldy, INT_MAX); /* the ymm GEMV's rows */         \
    }

Z_DOT_ENTRY(dsv4_fp4x_dot_z512, z_rows_bw, TGT_PLAIN)
Z_DOT_ENTRY(dsv4_fp4x_dot_z512v, z_rows_vnni, TGT_VNNI)
