/*
 * fp4_int_dot.c - lever (a) of issue 40 measured alone: FP4 (e2m1, e8m0 per 32) GEMV with
 * exact integer block sums against the current f32 decode, on the CPU it runs on.
 *
 * The activations are e4m3 codes with a power-of-two scale per 128 inputs (docs/MODEL.md
 * §R5.3). a = e4m3 x 2^9 is an integer, |a| <= 229376, and w2 = 2 x e2m1 is in [-12, 12], so a
 * 32-block sum S = sum a * w2 is an exact integer. a = hi * 512 + lo (lo = a & 511, hi = a >> 9)
 * puts both halves in int16, and S = 512 * sum(hi * w2) + sum(lo * w2): two int16 dot products
 * (VPMADDWD, VPDPWSSD). The weights' nibbles become int8 w2 through one VPSHUFB; interleaving
 * them with zero bytes (VPUNPCK[LH]BW) makes int16 w2 * 256 with no sign extension, and the
 * 2^8 goes into the scale. Each lane's 512 * hi + lo (|.| < 2^24, times 2^8) is exact in f32,
 * so VCVTDQ2PS twice and one FMA by 512 combine the halves exactly; one FMA by the block's
 * scale (2^(e_w - 127) * s_x * 2^-18, from a table indexed by e_w + the token's exponent: a
 * broadcast load, no vector ALU work) rounds once per block and lane.
 *
 * Vector ALU uops per 32 weights and row (loads and broadcasts from memory not counted; NT
 * tokens share the decoding; "chain": see i2_dot):
 *
 *   variant               decode               per token                           1 tok  4 tok
 *   f32-current (avx2)    4x(SRLVD PERMPS      4 FMA                                22     34
 *                         SLLD XOR) + MUL XOR
 *   int-avx2              SRLVD AND PSHUFB     4 PMADDWD 2 PADDD 2 CVTDQ2PS 2 FMA   15     45
 *                         2 PUNPCK (5)
 *   int-avx2-chain        5 + 2 PSRAW          4 PMADDWD 3 PADDD 1 CVT 1 FMA        16     43
 *   int-avxvnni           5                    2 PMADDWD 2 DPWSSD 2 CVT 2 FMA       13     37
 *   int-avxvnni-chain     5 + 2 PSRAW          1 PMADDWD 3 DPWSSD 1 CVT 1 FMA       13     31
 *   int-avx512vnni        5 per 64 (zmm)       per 64: 2 PMADDWD 2 DPWSSD 2 CVT     7     20.5
 *                                            2 FMA 1 BLENDMPS (two blocks' scales)
 *   int-avx512vnni-chain  7 per 64             per 64: 1 PMADDWD 3 DPWSSD 1 CVT      7     17.5
 *                                            1 FMA 1 BLENDMPS
 *   f32-avx512-current    2x(PSRLW PUNPCKLBW   2 FMA                                11     17
 *                         PMOVZXBD PERMPS)+MUL
 *
 * Per token the integer route costs more than an FMA route (two dot products per product,
 * conversion, FMAs) and saves only in the decode, so it should win at one token and lose or
 * tie at four; the figures (bench/levers/README.md) say by how much. GCC spills some
 * accumulators or weight vectors in every 4-row kernel here (as in the current one): the
 * counts are what the kernels ask for, not what the compiler emits.
 *
 * Usage: build/bench_fp4_int_dot [runs]   (make bench-levers). Exit 1 when a check fails.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TGT_AVX2 __attribute__((target("avx2,fma")))
#define TGT_VNNI __attribute__((target("avx2,fma,avxvnni")))
#define TGT_512  __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vnni")))
#define INL      static inline __attribute__((always_inline))
/* as simd_kernels.inc: the row and token loops unrolled, so the accumulators stay in registers */
#define UNROLL4  _Pragma("GCC unroll 4")

enum { MAXT = 4, EX_OFF = 64 };

/* The activations' int16 layouts: ymm or zmm decode order; hi as it is (two sums) or doubled
 * (one chain). */
enum lay { L256, L256C, L512, L512C };

/* One problem: W [n][k/2] nibbles, scales [n][k/32] e8m0; nt tokens of activations in every
 * form the variants take. */
struct prob {
    int      n, k, nt;
    uint8_t *w, *sw;
    uint8_t *code;        /* [nt][k] e4m3 codes */
    int8_t  *ex;          /* [nt][k/128] activation scale exponents */
    float   *x;           /* [nt][k] dequantised activations (f32 variants) */
    int16_t *act[4];      /* [nt][2k] hi/lo in the enum lay orders */
    float   *y;           /* [nt][n] */
};

static float tab_sc[512];    /* 2^(i - EX_OFF - 127 - 18): e_w + ex + EX_OFF (+ 8 for a chain) -> block scale */
static float tab_half[256];  /* the current kernel's k_e8m0_half: 2^(e - 128) */

/* ------------------------------------------------------------------ e4m3 and the layouts */

/* e4m3 code -> value x 2^9, an exact integer (codes 0x7f / 0xff, NaN, are never drawn). */
static int32_t e4m3_a(uint8_t c)
{
    int e = (c >> 3) & 15, m = c & 7;
    int32_t v = e == 0 ? m : (8 + m) << (e - 1);
    return c & 0x80 ? -v : v;
}

/* Where the ymm decode puts weight k of a 32-block: [W0 (16) | W1 (16)], W0 = k 0..14 even
 * then 1..15 odd (VPSHUFB lanes: even nibbles, odd nibbles; VPUNPCKLBW: their first 8). */
static int pos256(int k)
{
    int hi = k >= 16, j = k & 15;
    return hi * 16 + (j & 1) * 8 + j / 2;
}

/* The zmm decode over a pair of blocks (64 weights): word p of W0 is 128-bit lane L = p / 8,
 * i = p % 8 -> block L & 1, k = 2i + (L >> 1); W1 the same + 16. */
static int pos512(int k64)
{
    int blk = k64 / 32, k = k64 % 32, hi = k >= 16, j = k & 15;
    int lane = (j & 1) * 2 + blk;
    return hi * 32 + lane * 8 + j / 2;
}

/* hi/lo halves per block (ymm: 64 int16 per 32 weights, [H0 H1 L0 L1]) and per block pair
 * (zmm: 128 int16 per 64 weights, [H0 H1 L0 L1] of 32 each); the chain layouts hold 2 hi. */
static void arrange(const uint8_t *code, int k, int16_t *const act[4])
{
    for (int i = 0; i < k; i++) {
        int32_t a  = e4m3_a(code[i]);
        int16_t hi = (int16_t)(a >> 9), lo = (int16_t)(a & 511);
        int     p  = i / 32 * 64 + pos256(i % 32), q = i / 64 * 128 + pos512(i % 64);
        act[L256][p] = hi, act[L256C][p] = (int16_t)(2 * hi);
        act[L256][p + 32] = act[L256C][p + 32] = lo;
        act[L512][q] = hi, act[L512C][q] = (int16_t)(2 * hi);
        act[L512][q + 64] = act[L512C][q + 64] = lo;
    }
}

/* ------------------------------------------------------------------ f32-current (avx2) */

/* x86_avx2.c v_fp4_tab / v_fp4s as they are (see there for why). */
INL TGT_AVX2 __m256 c2_tab(float s)
{
    __m256 mag = _mm256_mul_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 6, 8, 12), _mm256_set1_ps(s));
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28,
                                                                     6 << 28, 7 << 28)));
}

INL TGT_AVX2 __m256 c2_fp4s(const uint8_t *p, __m256 tab)
{
    int32_t u;
    memcpy(&u, p, 4);
    __m256i n = _mm256_srlv_epi32(_mm256_set1_epi32(u), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(tab, n), _mm256_castsi256_ps(_mm256_slli_epi32(n, 28)));
}

/* simd_kernels.inc k_prefetch4 for FP4: one line a row per 4 blocks, 1024 bytes ahead, into
 * the next four rows near a row's end. */
INL void pf4(const struct prob *P, int ow, int kb)
{
    if (kb % 128) return;
    int kp = kb + 2048, rp = ow;
    if (kp >= P->k) {
        kp -= P->k;
        rp += 4;
    }
    if (kp < P->k && rp + 4 <= P->n)
        UNROLL4
        for (int r = 0; r < 4; r++) __builtin_prefetch(P->w + ((size_t)(rp + r) * (size_t)P->k + (size_t)kp) / 2, 0, 3);
}

/* simd_kernels.inc k_rows4 for kind 1 (FP4), 8 lanes. */
INL TGT_AVX2 void c2_rows4(const struct prob *P, int NT, int ow)
{
    const uint8_t *wr[4];
    __m256         a[4][MAXT];
    UNROLL4
    for (int r = 0; r < 4; r++) wr[r] = P->w + (size_t)(ow + r) * (size_t)(P->k / 2);
    UNROLL4
    for (int r = 0; r < 4; r++)
        UNROLL4
        for (int t = 0; t < MAXT; t++) a[r][t] = _mm256_setzero_ps();
    for (int kb = 0; kb < P->k; kb += 32) {
        __m256 s[4];
        UNROLL4
        for (int r = 0; r < 4; r++) s[r] = c2_tab(tab_half[P->sw[(size_t)(ow + r) * (size_t)(P->k / 32) + (size_t)(kb / 32)]]);
        pf4(P, ow, kb);
        for (size_t k = (size_t)kb; k < (size_t)kb + 32; k += 8) {
            __m256 wv[4];
            UNROLL4
            for (int r = 0; r < 4; r++) wv[r] = c2_fp4s(wr[r] + k / 2, s[r]);
            UNROLL4
            for (int t = 0; t < NT; t++) {
                __m256 xv = _mm256_loadu_ps(P->x + (size_t)t * (size_t)P->k + k);
                UNROLL4
                for (int r = 0; r < 4; r++) a[r][t] = _mm256_fmadd_ps(wv[r], xv, a[r][t]);
            }
        }
    }
    UNROLL4
    for (int r = 0; r < 4; r++)
        UNROLL4
        for (int t = 0; t < NT; t++) {
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(a[r][t]), _mm256_extractf128_ps(a[r][t], 1));
            h        = _mm_add_ps(h, _mm_movehl_ps(h, h));
            h        = _mm_add_ss(h, _mm_movehdup_ps(h));
            P->y[(size_t)t * (size_t)P->n + (size_t)(ow + r)] = _mm_cvtss_f32(h);
        }
}

static TGT_AVX2 void run_c2(const struct prob *P, int o0, int o1)
{
    for (int o = o0; o < o1; o += 4) P->nt == 1 ? c2_rows4(P, 1, o) : c2_rows4(P, 4, o);
}

/* ------------------------------------------------------------------ f32-avx512-current */

/* x86_avx512.c v_fp4_tab / v_fp4s as they are. */
INL TGT_512 __m512 c5_tab(float s)
{
    return _mm512_mul_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), _mm512_set1_ps(s));
}

INL TGT_512 __m512 c5_fp4s(const uint8_t *p, __m512 tab)
{
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    __m128i n = _mm_unpacklo_epi8(b, _mm_srli_epi16(b, 4));
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(n), tab);
}

INL TGT_512 void c5_rows4(const struct prob *P, int NT, int ow)
{
    const uint8_t *wr[4];
    __m512         a[4][MAXT];
    UNROLL4
    for (int r = 0; r < 4; r++) wr[r] = P->w + (size_t)(ow + r) * (size_t)(P->k / 2);
    UNROLL4
    for (int r = 0; r < 4; r++)
        UNROLL4
        for (int t = 0; t < MAXT; t++) a[r][t] = _mm512_setzero_ps();
    for (int kb = 0; kb < P->k; kb += 32) {
        __m512 s[4];
        UNROLL4
        for (int r = 0; r < 4; r++) s[r] = c5_tab(tab_half[P->sw[(size_t)(ow + r) * (size_t)(P->k / 32) + (size_t)(kb / 32)]]);
        pf4(P, ow, kb);
        for (size_t k = (size_t)kb; k < (size_t)kb + 32; k += 16) {
            __m512 wv[4];
            UNROLL4
            for (int r = 0; r < 4; r++) wv[r] = c5_fp4s(wr[r] + k / 2, s[r]);
            UNROLL4
            for (int t = 0; t < NT; t++) {
                __m512 xv = _mm512_loadu_ps(P->x + (size_t)t * (size_t)P->k + k);
                UNROLL4
                for (int r = 0; r < 4; r++) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
            }
        }
    }
    UNROLL4
    for (int r = 0; r < 4; r++)
        UNROLL4
        for (int t = 0; t < NT; t++) P->y[(size_t)t * (size_t)P->n + (size_t)(ow + r)] = _mm512_reduce_add_ps(a[r][t]);
}

static TGT_512 void run_c5(const struct prob *P, int o0, int o1)
{
    for (int o = o0; o < o1; o += 4) P->nt == 1 ? c5_rows4(P, 1, o) : c5_rows4(P, 4, o);
}

/* ------------------------------------------------------------------ int, ymm (avx2, avx-vnni) */

/* A block's S from the f32 lanes its dot gives: exact integers (times unit), so their sum in
 * int64 is exact. */
static int64_t lanes_s(const float *f, int n, int unit)
{
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += (int64_t)f[i];
    return s / unit;
}

/* 16 bytes (32 nibbles) -> int16 w2 x 256 in the pos256 order. VBROADCASTI128 puts the bytes
 * in both lanes, the upper shifted by 4: after the AND the lower lane holds the even nibbles
 * and the upper the odd ones (a dword shift moves bits across bytes, but the AND keeps each
 * byte's own low nibble). */
INL TGT_AVX2 void i2_dec(const uint8_t *p, __m256i *w0, __m256i *w1)
{
    const __m256i tab = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8,
                                         12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    __m256i n = _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(15));
    __m256i v = _mm256_shuffle_epi8(tab, n);
    *w0       = _mm256_unpacklo_epi8(_mm256_setzero_si256(), v);
    *w1       = _mm256_unpackhi_epi8(_mm256_setzero_si256(), v);
}

/* The block's exact lane sums as f32 from the decoded weights u = 256 w2 and h = [H0 H1 L0 L1].
 * Two sums (as issue 40 puts it): lanes of 256 sum(hi w2) and 256 sum(lo w2), each converted,
 * 512 x the first plus the second in one FMA (exact: 256 x S_lane, |S_lane| < 2^24); the scale
 * takes 2^-18. One chain: the lo products take w2 = u >> 8 and the hi products u against
 * doubled hi (|2 hi| <= 896), so one int32 chain of four dot products is 512 sum(hi w2) +
 * sum(lo w2) = S_lane (|.| < 2^24: no overflow), one conversion, and the scale takes 2^-10:
 * two shifts per row more in the decode, two conversions and an FMA fewer per token. */
INL TGT_AVX2 __m256 i2_dot(__m256i w0, __m256i w1, const int16_t *h)
{
    const __m256i *q  = (const __m256i *)(const void *)h;
    __m256i        hi = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(q)), _mm256_madd_epi16(w1, _mm256_loadu_si256(q + 1)));
    __m256i        lo = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(q + 2)), _mm256_madd_epi16(w1, _mm256_loadu_si256(q + 3)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_set1_ps(512.0f), _mm256_cvtepi32_ps(lo));
}

INL TGT_AVX2 __m256 i2c_dot(__m256i w0, __m256i w1, const int16_t *h)
{
    const __m256i *q  = (const __m256i *)(const void *)h;
    __m256i        hi = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(q)), _mm256_madd_epi16(w1, _mm256_loadu_si256(q + 1)));
    __m256i        lo = _mm256_add_epi32(_mm256_madd_epi16(_mm256_srai_epi16(w0, 8), _mm256_loadu_si256(q + 2)),
                                         _mm256_madd_epi16(_mm256_srai_epi16(w1, 8), _mm256_loadu_si256(q + 3)));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(hi, lo));
}

INL TGT_VNNI __m256 iv_dot(__m256i w0, __m256i w1, const int16_t *h)
{
    const __m256i *q  = (const __m256i *)(const void *)h;
    __m256i        hi = _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(q)), w1, _mm256_loadu_si256(q + 1));
    __m256i        lo = _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(q + 2)), w1, _mm256_loadu_si256(q + 3));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_set1_ps(512.0f), _mm256_cvtepi32_ps(lo));
}

INL TGT_VNNI __m256 ivc_dot(__m256i w0, __m256i w1, const int16_t *h)
{
    const __m256i *q   = (const __m256i *)(const void *)h;
    __m256i        acc = _mm256_madd_epi16(_mm256_srai_epi16(w0, 8), _mm256_loadu_si256(q + 2));
    acc                = _mm256_dpwssd_avx_epi32(acc, _mm256_srai_epi16(w1, 8), _mm256_loadu_si256(q + 3));
    acc                = _mm256_dpwssd_avx_epi32(acc, w0, _mm256_loadu_si256(q));
    return _mm256_cvtepi32_ps(_mm256_dpwssd_avx_epi32(acc, w1, _mm256_loadu_si256(q + 1)));
}

/* Four rows x NT tokens; DOT one of the above, LAY its activations, SOFF 0 (two sums) or 8
 * (one chain): the scale is tab_sc[e_w + ex + EX_OFF + SOFF]. */
#define INT256_ROWS4(NAME, TGT, DOT, LAY, SOFF)                                                               \
    INL TGT void NAME(const struct prob *P, int NT, int ow)                                                   \
    {                                                                                                         \
        const uint8_t *wr[4], *er[4];                                                                         \
        __m256         a[4][MAXT];                                                                            \
        size_t         nb = (size_t)P->k / 32;                                                                \
        UNROLL4                                                                                               \
        for (int r = 0; r < 4; r++) {                                                                         \
            wr[r] = P->w + (size_t)(ow + r) * (size_t)(P->k / 2);                                             \
            er[r] = P->sw + (size_t)(ow + r) * nb;                                                            \
        }                                                                                                     \
        UNROLL4                                                                                               \
        for (int r = 0; r < 4; r++)                                                                           \
            UNROLL4                                                                                           \
            for (int t = 0; t < MAXT; t++) a[r][t] = _mm256_setzero_ps();                                     \
        for (size_t b = 0; b < nb; b++) {                                                                     \
            __m256i w0[4], w1[4];                                                                             \
            pf4(P, ow, (int)b * 32);                                                                          \
            UNROLL4                                                                                           \
            for (int r = 0; r < 4; r++) i2_dec(wr[r] + b * 16, &w0[r], &w1[r]);                               \
            UNROLL4                                                                                           \
            for (int t = 0; t < NT; t++) {                                                                    \
                const int16_t *h  = P->act[LAY] + (size_t)t * (size_t)P->k * 2 + b * 64;                     \
                const float   *ts = tab_sc + EX_OFF + SOFF + P->ex[(size_t)t * (size_t)(P->k / 128) + b / 4]; \
                UNROLL4                                                                                       \
                for (int r = 0; r < 4; r++)                                                                   \
                    a[r][t] = _mm256_fmadd_ps(DOT(w0[r], w1[r], h), _mm256_broadcast_ss(ts + er[r][b]), a[r][t]); \
            }                                                                                                 \
        }                                                                                                     \
        UNROLL4                                                                                               \
        for (int r = 0; r < 4; r++)                                                                           \
            UNROLL4                                                                                           \
            for (int t = 0; t < NT; t++) {                                                                    \
                __m128 s = _mm_add_ps(_mm256_castps256_ps128(a[r][t]), _mm256_extractf128_ps(a[r][t], 1));    \
                s        = _mm_add_ps(s, _mm_movehl_ps(s, s));                                                \
                s        = _mm_add_ss(s, _mm_movehdup_ps(s));                                                 \
                P->y[(size_t)t * (size_t)P->n + (size_t)(ow + r)] = _mm_cvtss_f32(s);                         \
            }                                                                                                 \
    }                                                                                                         \
    static TGT void run_##NAME(const struct prob *P, int o0, int o1)                                          \
    {                                                                                                         \
        for (int o = o0; o < o1; o += 4) P->nt == 1 ? NAME(P, 1, o) : NAME(P, 4, o);                         \
    }                                                                                                         \
    /* S of every block of row o against token 0, into S[k/32] (the lanes are exact integers */               \
    /* times 256 for two sums). */                                                                            \
    static TGT void sums_##NAME(const struct prob *P, int o, int64_t *S)                                      \
    {                                                                                                         \
        for (int b = 0; b < P->k / 32; b++) {                                                                 \
            __m256i w0, w1;                                                                                   \
            float   f[8];                                                                                     \
            i2_dec(P->w + (size_t)o * (size_t)(P->k / 2) + (size_t)b * 16, &w0, &w1);                         \
            _mm256_storeu_ps(f, DOT(w0, w1, P->act[LAY] + (size_t)b * 64));                                   \
            S[b] = lanes_s(f, 8, SOFF ? 1 : 256);                                                             \
        }                                                                                                     \
    }

INT256_ROWS4(i2, TGT_AVX2, i2_dot, L256, 0)
INT256_ROWS4(i2c, TGT_AVX2, i2c_dot, L256C, 8)
INT256_ROWS4(iv, TGT_VNNI, iv_dot, L256, 0)
INT256_ROWS4(ivc, TGT_VNNI, ivc_dot, L256C, 8)

/* ------------------------------------------------------------------ int, zmm (avx-512 vnni) */

/* 32 bytes (two blocks) -> int16 w2 x 256 in the pos512 order: the broadcast gives lanes
 * [b0 b1 b0 b1], the shift of the upper two by 4 makes them the odd nibbles. */
INL TGT_512 void i5_dec(const uint8_t *p, __m512i *w0, __m512i *w1)
{
    const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
    __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    __m512i n = _mm512_and_si512(_mm512_srlv_epi32(b, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4)),
                                 _mm512_set1_epi8(15));
    __m512i v = _mm512_shuffle_epi8(tab, n);
    *w0       = _mm512_unpacklo_epi8(_mm512_setzero_si512(), v);
    *w1       = _mm512_unpackhi_epi8(_mm512_setzero_si512(), v);
}

/* As i2_dot / ivc_dot over a block pair: dword lanes 0-3 and 8-11 belong to the first block,
 * 4-7 and 12-15 to the second. */
INL TGT_512 __m512 i5_dot(__m512i w0, __m512i w1, const int16_t *h)
{
    const __m512i *q  = (const __m512i *)(const void *)h;
    __m512i        hi = _mm512_dpwssd_epi32(_mm512_madd_epi16(w0, _mm512_loadu_si512(q)), w1, _mm512_loadu_si512(q + 1));
    __m512i        lo = _mm512_dpwssd_epi32(_mm512_madd_epi16(w0, _mm512_loadu_si512(q + 2)), w1, _mm512_loadu_si512(q + 3));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_set1_ps(512.0f), _mm512_cvtepi32_ps(lo));
}

INL TGT_512 __m512 i5c_dot(__m512i w0, __m512i w1, const int16_t *h)
{
    const __m512i *q   = (const __m512i *)(const void *)h;
    __m512i        acc = _mm512_madd_epi16(_mm512_srai_epi16(w0, 8), _mm512_loadu_si512(q + 2));
    acc                = _mm512_dpwssd_epi32(acc, _mm512_srai_epi16(w1, 8), _mm512_loadu_si512(q + 3));
    acc                = _mm512_dpwssd_epi32(acc, w0, _mm512_loadu_si512(q));
    return _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(acc, w1, _mm512_loadu_si512(q + 1)));
}

/* The zmm kernel: INT256_ROWS4 over block pairs, the two blocks' scales blended per lane. */
#define INT512_ROWS4(NAME, DOT, LAY, SOFF)                                                                    \
    INL TGT_512 void NAME(const struct prob *P, int NT, int ow)                                               \
    {                                                                                                         \
        const uint8_t *wr[4], *er[4];                                                                         \
        __m512         a[4][MAXT];                                                                            \
        size_t         nb = (size_t)P->k / 32;                                                                \
        UNROLL4                                                                                               \
        for (int r = 0; r < 4; r++) {                                                                         \
            wr[r] = P->w + (size_t)(ow + r) * (size_t)(P->k / 2);                                             \
            er[r] = P->sw + (size_t)(ow + r) * nb;                                                            \
        }                                                                                                     \
        UNROLL4                                                                                               \
        for (int r = 0; r < 4; r++)                                                                           \
            UNROLL4                                                                                           \
            for (int t = 0; t < MAXT; t++) a[r][t] = _mm512_setzero_ps();                                     \
        for (size_t b = 0; b < nb; b += 2) {                                                                  \
            __m512i w0[4], w1[4];                                                                             \
            pf4(P, ow, (int)b * 32);                                                                          \
            UNROLL4                                                                                           \
            for (int r = 0; r < 4; r++) i5_dec(wr[r] + b * 16, &w0[r], &w1[r]);                               \
            UNROLL4                                                                                           \
            for (int t = 0; t < NT; t++) {                                                                    \
                const int16_t *h  = P->act[LAY] + (size_t)t * (size_t)P->k * 2 + b * 64;                     \
                const float   *ts = tab_sc + EX_OFF + SOFF + P->ex[(size_t)t * (size_t)(P->k / 128) + b / 4]; \
                UNROLL4                                                                                       \
                for (int r = 0; r < 4; r++) {                                                                 \
                    __m512 s = _mm512_mask_blend_ps(0xf0f0, _mm512_set1_ps(ts[er[r][b]]),                     \
                                                    _mm512_set1_ps(ts[er[r][b + 1]]));                        \
                    a[r][t] = _mm512_fmadd_ps(DOT(w0[r], w1[r], h), s, a[r][t]);                              \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        UNROLL4                                                                                               \
        for (int r = 0; r < 4; r++)                                                                           \
            UNROLL4                                                                                           \
            for (int t = 0; t < NT; t++)                                                                      \
                P->y[(size_t)t * (size_t)P->n + (size_t)(ow + r)] = _mm512_reduce_add_ps(a[r][t]);            \
    }                                                                                                         \
    static TGT_512 void run_##NAME(const struct prob *P, int o0, int o1)                                      \
    {                                                                                                         \
        for (int o = o0; o < o1; o += 4) P->nt == 1 ? NAME(P, 1, o) : NAME(P, 4, o);                         \
    }                                                                                                         \
    static TGT_512 void sums_##NAME(const struct prob *P, int o, int64_t *S)                                  \
    {                                                                                                         \
        for (int b = 0; b < P->k / 32; b += 2) {                                                              \
            __m512i w0, w1;                                                                                   \
            float   f[16], f0[8], f1[8];                                                                      \
            i5_dec(P->w + (size_t)o * (size_t)(P->k / 2) + (size_t)b * 16, &w0, &w1);                         \
            _mm512_storeu_ps(f, DOT(w0, w1, P->act[LAY] + (size_t)b * 64));                                   \
            for (int i = 0; i < 8; i++) {                                                                     \
                f0[i] = f[(i & 3) + (i >> 2) * 8];                                                            \
                f1[i] = f[(i & 3) + (i >> 2) * 8 + 4];                                                        \
            }                                                                                                 \
            S[b]     = lanes_s(f0, 8, SOFF ? 1 : 256);                                                        \
            S[b + 1] = lanes_s(f1, 8, SOFF ? 1 : 256);                                                        \
        }                                                                                                     \
    }

INT512_ROWS4(i5, i5_dot, L512, 0)
INT512_ROWS4(i5c, i5c_dot, L512C, 8)

/* ------------------------------------------------------------------ reference and checks */

static const int W2[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

static int w2_at(const struct prob *P, int o, int k)
{
    uint8_t byte = P->w[(size_t)o * (size_t)(P->k / 2) + (size_t)k / 2];
    return W2[k & 1 ? byte >> 4 : byte & 15];
}

/* Block b's exact S of row o against token t, and the sum of its |products|. */
static int64_t ref_block(const struct prob *P, int t, int o, int b, int64_t *abs_sum)
{
    int64_t s = 0;
    *abs_sum  = 0;
    for (int k = b * 32; k < b * 32 + 32; k++) {
        int64_t p = (int64_t)w2_at(P, o, k) * e4m3_a(P->code[(size_t)t * (size_t)P->k + (size_t)k]);
        s += p;
        *abs_sum += p < 0 ? -p : p;
    }
    return s;
}

/* The reference of every y (double), with the sum of |block terms| (mag, the integer routes'
 * error scale) and of |products| (pmag, the f32 routes'). */
struct ref {
    double *y, *mag, *pmag;
};

static void ref_all(const struct prob *P, struct ref *R)
{
    for (int t = 0; t < P->nt; t++)
        for (int o = 0; o < P->n; o++) {
            double y = 0, mag = 0, pmag = 0;
            for (int b = 0; b < P->k / 32; b++) {
                int64_t ab, S = ref_block(P, t, o, b, &ab);
                double  sc = ldexp(1.0, P->sw[(size_t)o * (size_t)(P->k / 32) + (size_t)b] - 127 +
                                            P->ex[(size_t)t * (size_t)(P->k / 128) + (size_t)b / 4] - 10);
                y += (double)S * sc;
                mag += fabs((double)S) * sc;
                pmag += (double)ab * sc;
            }
            size_t i   = (size_t)t * (size_t)P->n + (size_t)o;
            R->y[i]    = y;
            R->mag[i]  = mag;
            R->pmag[i] = pmag;
        }
}

/* The worst |y - ref| / scale over P's outputs (scale: mag for the integer routes, pmag for
 * the f32 ones). */
static double worst_err(const struct prob *P, const struct ref *R, int f32)
{
    double worst = 0;
    for (size_t i = 0; i < (size_t)P->nt * (size_t)P->n; i++) {
        double d = fabs((double)P->y[i] - R->y[i]), m = f32 ? R->pmag[i] : R->mag[i];
        double e = m > 0 ? d / m : d == 0 ? 0 : INFINITY;
        if (!(e <= worst)) worst = e; /* a NaN is the worst */
    }
    return worst;
}

/* ------------------------------------------------------------------ variants, threads, timing */

struct variant {
    const char *name, *isa;
    int         f32; /* f32 route: 1e-4, else 1e-5 */
    int         zmm; /* compared with f32-avx512-current (the last), else f32-current (the first) */
    void (*run)(const struct prob *P, int o0, int o1);
    void (*sums)(const struct prob *P, int o, int64_t *S); /* integer routes */
    int (*has)(void);
};

static int has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
static int has_vnni(void) { return has_avx2() && __builtin_cpu_supports("avxvnni"); }
static int has_512(void)
{
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}

static const struct variant VARIANTS[] = {
    { "f32-current", "avx2+fma", 1, 0, run_c2, NULL, has_avx2 },
    { "int-avx2", "avx2+fma", 0, 0, run_i2, sums_i2, has_avx2 },
    { "int-avx2-chain", "avx2+fma", 0, 0, run_i2c, sums_i2c, has_avx2 },
    { "int-avxvnni", "avx-vnni", 0, 0, run_iv, sums_iv, has_vnni },
    { "int-avxvnni-chain", "avx-vnni", 0, 0, run_ivc, sums_ivc, has_vnni },
    { "int-avx512vnni", "avx512f+bw+vnni", 0, 1, run_i5, sums_i5, has_512 },
    { "int-avx512vnni-chain", "avx512f+bw+vnni", 0, 1, run_i5c, sums_i5c, has_512 },
    { "f32-avx512-current", "avx512f+bw", 1, 1, run_c5, NULL, has_512 },
};
enum { NVAR = sizeof VARIANTS / sizeof VARIANTS[0] };

/* Two threads, each half the rows: the caller and one worker started once, in step through
 * a barrier at both ends of every run (thread start-up stays out of the timings). */
struct pool {
    pthread_t             th;
    pthread_barrier_t     bar;
    const struct prob    *P;
    const struct variant *v;
    int                   quit;
};

static int half_rows(const struct prob *P) { return P->n / 8 * 4; }

static void *worker(void *arg)
{
    struct pool *pl = arg;
    for (;;) {
        pthread_barrier_wait(&pl->bar);
        if (pl->quit) return NULL;
        pl->v->run(pl->P, half_rows(pl->P), pl->P->n);
        pthread_barrier_wait(&pl->bar);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double run2(struct pool *pl, const struct prob *P, const struct variant *v)
{
    pl->P = P;
    pl->v = v;
    double t0 = now();
    pthread_barrier_wait(&pl->bar);
    v->run(P, 0, half_rows(P));
    pthread_barrier_wait(&pl->bar);
    return now() - t0;
}

/* ------------------------------------------------------------------ problems */

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static void *xalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "fp4_int_dot: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* Random nibbles, e8m0 scales in [118, 130], e4m3 codes of every kind but NaN (subnormals and
 * both signs included), activation exponents in [-8, 8]; nt = MAXT tokens (a run may use 1). */
static void prob_init(struct prob *P, int n, int k)
{
    size_t nk = (size_t)n * (size_t)k;
    P->n = n, P->k = k, P->nt = MAXT;
    P->w    = xalloc(nk / 2);
    P->sw   = xalloc(nk / 32);
    P->code = xalloc((size_t)MAXT * (size_t)k);
    P->ex   = xalloc((size_t)MAXT * (size_t)k / 128);
    P->x    = xalloc(sizeof(float) * MAXT * (size_t)k);
    for (int l = 0; l < 4; l++) P->act[l] = xalloc(sizeof(int16_t) * 2 * MAXT * (size_t)k);
    P->y    = xalloc(sizeof(float) * MAXT * (size_t)n);
    for (size_t i = 0; i < nk / 2; i++) P->w[i] = (uint8_t)rnd();
    for (size_t i = 0; i < nk / 32; i++) P->sw[i] = (uint8_t)(118 + rnd() % 13);
    UNROLL4
    for (int t = 0; t < MAXT; t++) {
        uint8_t *c = P->code + (size_t)t * (size_t)k;
        for (int i = 0; i < k / 128; i++) P->ex[t * (k / 128) + i] = (int8_t)((int)(rnd() % 17) - 8);
        for (int i = 0; i < k; i++) {
            do c[i] = (uint8_t)rnd();
            while ((c[i] & 0x7f) == 0x7f);
            P->x[(size_t)t * (size_t)k + (size_t)i] = (float)ldexp(e4m3_a(c[i]), P->ex[t * (k / 128) + i / 128] - 9);
        }
        int16_t *act[4];
        for (int l = 0; l < 4; l++) act[l] = P->act[l] + (size_t)t * 2 * (size_t)k;
        arrange(c, k, act);
    }
}

static void prob_free(struct prob *P)
{
    free(P->w), free(P->sw), free(P->code), free(P->ex), free(P->x), free(P->y);
    for (int l = 0; l < 4; l++) free(P->act[l]);
}

/* ------------------------------------------------------------------ main */

/* Every available variant at 1 and 4 tokens against the reference; each integer route's
 * block sums of row 1 equal the reference's exactly. Returns the number of failures. */
static int check(struct pool *pl, struct prob *P)
{
    struct ref R;
    size_t     m = (size_t)MAXT * (size_t)P->n;
    int        fails = 0;
    R.y = xalloc(m * sizeof(double)), R.mag = xalloc(m * sizeof(double)), R.pmag = xalloc(m * sizeof(double));
    ref_all(P, &R);
    for (int i = 0; i < NVAR; i++) {
        const struct variant *v = &VARIANTS[i];
        if (!v->has()) continue;
        for (int nt = 1; nt <= MAXT; nt += MAXT - 1) {
            P->nt = nt;
            memset(P->y, 0xff, m * sizeof(float)); /* NaN: an output not written fails */
            run2(pl, P, v);
            double w = worst_err(P, &R, v->f32), tol = v->f32 ? 1e-4 : 1e-5;
            printf("  %-20s %d tok  worst |y - ref| / sum|terms| = %.2e (<= %.0e)  %s\n", v->name, nt, w, tol,
                   w <= tol ? "PASS" : "FAIL");
            fails += !(w <= tol);
        }
        if (v->sums) {
            int64_t *S = xalloc(sizeof(int64_t) * (size_t)(P->k / 32)), ab;
            int      bad = 0;
            v->sums(P, 1, S);
            for (int b = 0; b < P->k / 32; b++) bad += S[b] != ref_block(P, 0, 1, b, &ab);
            printf("  %-20s block sums of row 1 (%d blocks) exact: %s\n", v->name, P->k / 32, bad ? "FAIL" : "PASS");
            fails += bad != 0;
            free(S);
        }
    }
    P->nt = MAXT;
    free(R.y), free(R.mag), free(R.pmag);
    return fails;
}

/* Best of runs per variant, the variants interleaved (one run of each per round) so that a
 * neighbour's load on the shared cores falls on all of them alike; the ratio to the current
 * kernel of the same width is the figure to read. */
static void bench(struct pool *pl, struct prob *P, const char *label, int runs)
{
    double bytes = (double)P->n * (double)P->k * (0.5 + 1.0 / 32);
    printf("\n%s: N=%d K=%d (%.1f MiB of FP4 weights and scales), best of %d interleaved runs, 2 threads\n", label,
           P->n, P->k, bytes / 1048576.0, runs);
    printf("  %-20s %4s %9s %10s %8s %8s\n", "variant", "tok", "ms", "Gweight/s", "GB/s", "speedup");
    for (int nt = 1; nt <= MAXT; nt += MAXT - 1) {
        double best[NVAR];
        P->nt = nt;
        for (int i = 0; i < NVAR; i++) {
            best[i] = INFINITY;
            if (VARIANTS[i].has()) run2(pl, P, &VARIANTS[i]); /* warm */
        }
        for (int r = 0; r < runs; r++)
            for (int i = 0; i < NVAR; i++)
                if (VARIANTS[i].has()) {
                    double t = run2(pl, P, &VARIANTS[i]);
                    best[i]  = t < best[i] ? t : best[i];
                }
        for (int i = 0; i < NVAR; i++) {
            if (!VARIANTS[i].has()) continue;
            /* against f32-current, or f32-avx512-current for the zmm variants */
            double base = VARIANTS[i].zmm ? best[NVAR - 1] : best[0];
            printf("  %-20s %4d %9.3f %10.2f %8.2f %7.2fx\n", VARIANTS[i].name, nt, 1e3 * best[i],
                   (double)P->n * (double)P->k / best[i] * 1e-9, bytes / best[i] * 1e-9, base / best[i]);
        }
    }
    P->nt = MAXT;
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 20;
    if (runs < 1) runs = 20;
    __builtin_cpu_init();
    for (int i = 0; i < 512; i++) tab_sc[i] = (float)ldexp(1.0, i - EX_OFF - 127 - 18);
    for (int e = 0; e < 256; e++) tab_half[e] = (float)ldexp(1.0, e - 128);
    for (int i = 0; i < NVAR; i++)
        if (!VARIANTS[i].has())
            printf("skip %s: this CPU lacks %s\n", VARIANTS[i].name, VARIANTS[i].isa);

    struct pool pl = { 0 };
    pthread_barrier_init(&pl.bar, NULL, 2);
    if (pthread_create(&pl.th, NULL, worker, &pl)) {
        fprintf(stderr, "fp4_int_dot: cannot start a thread\n");
        return 2;
    }
    struct prob small, big;
    prob_init(&small, 4096, 4096);
    printf("correctness (N=4096 K=4096, random codes, scales 2^(118..130 - 127), activation exponents -8..8):\n");
    int fails = check(&pl, &small);
    bench(&pl, &small, "in cache (L3)", runs);
    prob_free(&small);
    prob_init(&big, 32768, 4096);
    bench(&pl, &big, "DRAM", runs);
    prob_free(&big);

    pl.quit = 1;
    pthread_barrier_wait(&pl.bar);
    pthread_join(pl.th, NULL);
    pthread_barrier_destroy(&pl.bar);
    printf("\n%s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
