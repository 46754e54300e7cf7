/*
 * x86_avx2.c - the AVX2 kernels (AVX2 + FMA + F16C): 8 f32 lanes of the projection template
 * in simd_kernels.inc, and 8 f32 / 4 f64 lanes of the row ops in simd_rows.inc. The level
 * valgrind can run (DSV4_CPU=avx2). Compiled with -mavx2 -mfma -mf16c; only called after the
 * CPU check (cpu.c).
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

typedef __m256 VEC;
#define VW 8

static inline VEC v_zero(void) { return _mm256_setzero_ps(); }
static inline VEC v_set1(float a) { return _mm256_set1_ps(a); }
static inline VEC v_loadu(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_storeu(float *p, VEC v) { _mm256_storeu_ps(p, v); }
static inline VEC v_fma(VEC a, VEC b, VEC c) { return _mm256_fmadd_ps(a, b, c); }
static inline VEC v_mul(VEC a, VEC b) { return _mm256_mul_ps(a, b); }
static inline VEC v_add(VEC a, VEC b) { return _mm256_add_ps(a, b); }

static inline float v_hsum(VEC v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s        = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s        = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 e4m3 bytes -> floats equal to value / 256 (see x86_avx512.c). Sign-extending the byte
 * puts copies of the sign in bits 15 and 14 after the shift by 7, and the mask keeps bit 15
 * and the seven code bits (13..7): the f16 with the code's exponent and mantissa in place,
 * two integer operations fewer than building sign and magnitude apart. */
static inline VEC v_e4m3(const uint8_t *p)
{
    __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16((short)0xbf80)));
}

static inline VEC v_fp4(const uint8_t *p)
{
    /* 4 bytes -> 8 nibbles in order (low first) -> doubled e2m1 values through pshufb */
    const __m128i tab = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    int32_t       u;
    memcpy(&u, p, 4);
    __m128i b  = _mm_cvtsi32_si128(u);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(15));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15));
    __m128i v  = _mm_shuffle_epi8(tab, _mm_unpacklo_epi8(lo, hi));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

/* FP4 with the block's scale folded into a table of the eight magnitudes (doubled e2m1 values
 * times the scale, which includes the 1/2: the very products v_fp4 times the scale gives).
 * Each of 8 lanes shifts its nibble down (VPSRLVD), VPERMPS reads the magnitude by the low 3
 * bits and the nibble's bit 3 becomes the sign: no integer conversion and no multiply. The
 * sign costs one shift and one XOR: the nibble shifted to bits 28..31 is the sign in bit 31
 * and the magnitude's index in bits 28..30, and each table entry i comes with i << 28 XORed
 * in, so the XOR leaves the magnitude with the code's sign (the mask of bits 28..30 and the
 * OR it replaces took one operation more; scales are positive, so the same bits). A -0 for
 * code 8 where v_fp4 gave +0 changes no sum: the accumulators start at +0, and +0 + -0 is +0. */
static inline VEC v_fp4_tab(float s)
{
    VEC mag = _mm256_mul_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 6, 8, 12), _mm256_set1_ps(s));
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28,
                                                                     6 << 28, 7 << 28)));
}

static inline VEC v_fp4s(const uint8_t *p, VEC tab)
{
    int32_t u;
    memcpy(&u, p, 4);
    __m256i n = _mm256_srlv_epi32(_mm256_set1_epi32(u), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(tab, n), _mm256_castsi256_ps(_mm256_slli_epi32(n, 28)));
}

static inline VEC v_bf16(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* FP8 GEMV: the block scale on the activations where that keeps the bits (simd_kernels.inc,
 * k_rows4_sx): with one token, one multiply per 32 weights instead of per 8. */
#define K_FP8_SCALE_X 1
#include "backend/cpu/simd_kernels.inc"

/* ------------------------------------------------------------------ row ops (simd_rows.inc) */

typedef __m256d DVEC;
typedef __m256i VECI;
typedef __m256  VMASK; /* all-ones lanes, as the compares give them */
#define DW 4

static inline VEC   v_div(VEC a, VEC b) { return _mm256_div_ps(a, b); }
static inline VEC   v_max(VEC a, VEC b) { return _mm256_max_ps(a, b); }
static inline VEC   v_min(VEC a, VEC b) { return _mm256_min_ps(a, b); }
static inline VEC   v_round(VEC a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline VMASK v_lt(VEC a, VEC b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
static inline VMASK v_isnan(VEC a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
static inline VEC   v_sel(VMASK m, VEC t, VEC f) { return _mm256_blendv_ps(f, t, m); }
static inline VECI  v_bits(VEC a) { return _mm256_castps_si256(a); }
static inline VEC   v_of_bits(VECI a) { return _mm256_castsi256_ps(a); }
static inline VECI  vi_set1(uint32_t a) { return _mm256_set1_epi32((int)a); }
static inline VECI  vi_add(VECI a, VECI b) { return _mm256_add_epi32(a, b); }
static inline VECI  vi_and(VECI a, VECI b) { return _mm256_and_si256(a, b); }
static inline VECI  vi_or(VECI a, VECI b) { return _mm256_or_si256(a, b); }
static inline VECI  vi_srl(VECI a, int n) { return _mm256_srli_epi32(a, n); }

/* The maximum of 8 lanes that hold no NaN (any order gives the same value). */
static inline float v_hmax(VEC m)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s        = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s        = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline DVEC d_set1(double a) { return _mm256_set1_pd(a); }
static inline DVEC d_loadu(const double *p) { return _mm256_loadu_pd(p); }
static inline DVEC d_add(DVEC a, DVEC b) { return _mm256_add_pd(a, b); }
static inline DVEC d_sub(DVEC a, DVEC b) { return _mm256_sub_pd(a, b); }
static inline DVEC d_mul(DVEC a, DVEC b) { return _mm256_mul_pd(a, b); }
static inline DVEC d_div(DVEC a, DVEC b) { return _mm256_div_pd(a, b); }
static inline DVEC d_fma(DVEC a, DVEC b, DVEC c) { return _mm256_fmadd_pd(a, b, c); }
static inline DVEC d_fnma(DVEC a, DVEC b, DVEC c) { return _mm256_fnmadd_pd(a, b, c); }
static inline DVEC d_min(DVEC a, DVEC b) { return _mm256_min_pd(a, b); }
static inline DVEC d_max(DVEC a, DVEC b) { return _mm256_max_pd(a, b); }
static inline DVEC d_round(DVEC a) { return _mm256_round_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline DVEC d_rf32(DVEC a) { return _mm256_cvtps_pd(_mm256_cvtpd_ps(a)); }
static inline DVEC d_lo(VEC v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
static inline DVEC d_hi(VEC v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
static inline DVEC d_cvt(const float *p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
static inline VEC  v_of_pd(DVEC lo, DVEC hi) { return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo)); }

static inline double d_hsum(DVEC v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* 2^n for integral n in [-539, 539], built in the exponent field. */
static inline DVEC pow2_pd(__m128i n)
{
    return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(n), _mm256_set1_epi64x(1023)), 52));
}

/* AVX-512's VSCALEFPD p * 2^n (one rounding, inf or 0 beyond the range) as p * 2^a * 2^b with
 * a = floor(n / 2), b = n - a: both powers are normal for |n| <= 1077, the first product is
 * exact (p, e^r, is within [0.7, 1.5]) and the second rounds once, so the avx2 and avx512
 * levels agree bit for bit. A NaN p has a garbage n; any scale keeps p's NaN (first operand). */
static inline DVEC d_scalef(DVEC p, DVEC n)
{
    __m128i ni = _mm256_cvtpd_epi32(n);
    __m128i a  = _mm_srai_epi32(ni, 1);
    return _mm256_mul_pd(_mm256_mul_pd(p, pow2_pd(a)), pow2_pd(_mm_sub_epi32(ni, a)));
}

/* DW pairs (a0 b0 a1 b1 ...) -> a, b; and back from the results, rounded to f32. */
static inline void d_pairs(const float *p, DVEC *a, DVEC *b)
{
    VEC q = _mm256_permutevar8x32_ps(_mm256_loadu_ps(p), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    *a    = d_lo(q);
    *b    = d_hi(q);
}

static inline VEC v_pairs(DVEC ya, DVEC yb)
{
    __m128 a = _mm256_cvtpd_ps(ya), b = _mm256_cvtpd_ps(yb);
    return _mm256_set_m128(_mm_unpackhi_ps(a, b), _mm_unpacklo_ps(a, b));
}

/* The Hadamard butterflies of stride len (1 or 2) inside one register: lane j pairs with
 * j ^ len; the lower lane gets a + b, the upper a - b. */
static inline DVEC d_butterfly(DVEC v, int len)
{
    if (len == 1) {
        DVEC sw = _mm256_permute_pd(v, 0x5);
        return _mm256_blend_pd(_mm256_add_pd(v, sw), _mm256_sub_pd(sw, v), 0xa);
    }
    DVEC sw = _mm256_permute2f128_pd(v, v, 0x01);
    return _mm256_blend_pd(_mm256_add_pd(v, sw), _mm256_sub_pd(sw, v), 0xc);
}

#include "backend/cpu/simd_rows.inc"

const struct dsv4_kernels dsv4_kernels_avx2 = {
    .name     = "avx2",
    K_KERNEL_ENTRIES,
    K_ROW_ENTRIES,
};
