/*
 * x86_avx512.c - the AVX-512 kernels (F, BW, VL, DQ + F16C): 16 f32 lanes of the projection
 * template in simd_kernels.inc, and 16 f32 / 8 f64 lanes of the row ops in simd_rows.inc (the
 * f32 table of the avx512, avx512bf16 and amx levels). Compiled with -mavx512f -mavx512bw
 * -mavx512vl -mavx512dq -mfma -mf16c; only called when the CPU has them (cpu.c).
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

typedef __m512 VEC;
#define VW 16

static inline VEC v_zero(void) { return _mm512_setzero_ps(); }
static inline VEC v_set1(float a) { return _mm512_set1_ps(a); }
static inline VEC v_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_storeu(float *p, VEC v) { _mm512_storeu_ps(p, v); }
static inline VEC v_fma(VEC a, VEC b, VEC c) { return _mm512_fmadd_ps(a, b, c); }
static inline VEC v_mul(VEC a, VEC b) { return _mm512_mul_ps(a, b); }
static inline VEC v_add(VEC a, VEC b) { return _mm512_add_ps(a, b); }
static inline float v_hsum(VEC v) { return _mm512_reduce_add_ps(v); }

/* 16 e4m3 bytes -> floats equal to value / 256: the byte's sign and 7 magnitude bits placed
 * into an f16 (exponent bias 15 instead of 7, subnormals included), then converted.
 * Sign-extending the byte puts copies of the sign in bits 15 and 14 after the shift by 7; the
 * mask keeps bit 15 and the seven code bits (13..7) (as x86_avx2.c). */
static inline VEC v_e4m3(const uint8_t *p)
{
    __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xbf80)));
}

static inline VEC v_fp4(const uint8_t *p)
{
    /* 8 bytes -> 16 nibbles in order (low first) -> doubled e2m1 values through pshufb */
    const __m128i tab = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m128i b  = _mm_loadl_epi64((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(15));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15));
    __m128i v  = _mm_shuffle_epi8(tab, _mm_unpacklo_epi8(lo, hi));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
}

static inline VEC v_bf16(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* FP4 with the block's scale folded into a table of the 16 codes' values (doubled e2m1 values
 * times the scale, which includes the 1/2: the very products v_fp4 times the scale gives; code
 * 8, -0, as +0). VPERMPS reads only the low 4 bits of each index, so an index needs no mask:
 * VPMOVZXBQ puts byte m in qword m, and adding it shifted left by 28 puts the high nibble at
 * bit 0 of the qword's upper dword (lane 2m + 1) while the low nibble stays at bit 0 of lane
 * 2m. Per 16 weights: one widening, one shift, one OR, one permute; no conversion, no
 * multiply. */
static inline VEC v_fp4_tab(float s)
{
    return _mm512_mul_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), _mm512_set1_ps(s));
}

static inline VEC v_fp4s(const uint8_t *p, VEC tab)
{
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    __m128i n = _mm_unpacklo_epi8(b, _mm_srli_epi16(b, 4));
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(n), tab);
}

/* FP8 GEMV: the block scale on the activations where that keeps the bits (simd_kernels.inc,
 * k_rows4_sx); GEMM register tiles of 4 rows x 6 tokens (32 zmm registers). */
#define K_FP8_SCALE_X 1
#define K_TN          6
#include "backend/cpu/simd_kernels.inc"

/* ------------------------------------------------------------------ row ops (simd_rows.inc) */

typedef __m512d   DVEC;
typedef __m512i   VECI;
typedef __mmask16 VMASK;
#define DW 8

static inline VEC   v_div(VEC a, VEC b) { return _mm512_div_ps(a, b); }
static inline VEC   v_max(VEC a, VEC b) { return _mm512_max_ps(a, b); }
static inline VEC   v_min(VEC a, VEC b) { return _mm512_min_ps(a, b); }
static inline VEC   v_round(VEC a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline float v_hmax(VEC m) { return _mm512_reduce_max_ps(m); }
static inline VMASK v_lt(VEC a, VEC b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
static inline VMASK v_isnan(VEC a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
static inline VEC   v_sel(VMASK m, VEC t, VEC f) { return _mm512_mask_blend_ps(m, f, t); }
static inline VECI  v_bits(VEC a) { return _mm512_castps_si512(a); }
static inline VEC   v_of_bits(VECI a) { return _mm512_castsi512_ps(a); }
static inline VECI  vi_set1(uint32_t a) { return _mm512_set1_epi32((int)a); }
static inline VECI  vi_add(VECI a, VECI b) { return _mm512_add_epi32(a, b); }
static inline VECI  vi_and(VECI a, VECI b) { return _mm512_and_si512(a, b); }
static inline VECI  vi_or(VECI a, VECI b) { return _mm512_or_si512(a, b); }
static inline VECI  vi_srl(VECI a, int n) { return _mm512_srli_epi32(a, (unsigned)n); }

static inline DVEC   d_set1(double a) { return _mm512_set1_pd(a); }
static inline DVEC   d_loadu(const double *p) { return _mm512_loadu_pd(p); }
static inline DVEC   d_add(DVEC a, DVEC b) { return _mm512_add_pd(a, b); }
static inline DVEC   d_sub(DVEC a, DVEC b) { return _mm512_sub_pd(a, b); }
static inline DVEC   d_mul(DVEC a, DVEC b) { return _mm512_mul_pd(a, b); }
static inline DVEC   d_div(DVEC a, DVEC b) { return _mm512_div_pd(a, b); }
static inline DVEC   d_fma(DVEC a, DVEC b, DVEC c) { return _mm512_fmadd_pd(a, b, c); }
static inline DVEC   d_fnma(DVEC a, DVEC b, DVEC c) { return _mm512_fnmadd_pd(a, b, c); }
static inline DVEC   d_min(DVEC a, DVEC b) { return _mm512_min_pd(a, b); }
static inline DVEC   d_max(DVEC a, DVEC b) { return _mm512_max_pd(a, b); }
static inline DVEC   d_round(DVEC a) { return _mm512_roundscale_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline DVEC   d_rf32(DVEC a) { return _mm512_cvtps_pd(_mm512_cvtpd_ps(a)); }
static inline DVEC   d_scalef(DVEC p, DVEC n) { return _mm512_scalef_pd(p, n); } /* VSCALEFPD: one rounding */
static inline double d_hsum(DVEC v) { return _mm512_reduce_add_pd(v); }
static inline DVEC   d_lo(VEC v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline DVEC   d_hi(VEC v) { return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))); }
static inline DVEC   d_cvt(const float *p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }

static inline VEC v_of_pd(DVEC lo, DVEC hi)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
}

/* DW pairs (a0 b0 a1 b1 ...) -> a, b (the even and the odd floats); and back from the
 * results, rounded to f32. */
static inline void d_pairs(const float *p, DVEC *a, DVEC *b)
{
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    VEC           q    = _mm512_loadu_ps(p);
    *a                 = d_lo(_mm512_permutexvar_ps(even, q));
    *b                 = d_lo(_mm512_permutexvar_ps(_mm512_add_epi32(even, _mm512_set1_epi32(1)), q));
}

static inline VEC v_pairs(DVEC ya, DVEC yb)
{
    const __m512i ilv = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutex2var_ps(_mm512_castps256_ps512(_mm512_cvtpd_ps(ya)), ilv,
                                  _mm512_castps256_ps512(_mm512_cvtpd_ps(yb)));
}

/* The Hadamard butterflies of stride len (1, 2 or 4) inside one register: lane j pairs with
 * j ^ len; the lower lane gets a + b, the upper a - b. */
static inline DVEC d_butterfly(DVEC v, int len)
{
    DVEC sw = len == 1 ? _mm512_permute_pd(v, 0x55) : len == 2 ? _mm512_permutex_pd(v, 0x4e)
                                                               : _mm512_shuffle_f64x2(v, v, 0x4e);
    __mmask8 upper = len == 1 ? 0xaa : len == 2 ? 0xcc : 0xf0;
    return _mm512_mask_blend_pd(upper, _mm512_add_pd(v, sw), _mm512_sub_pd(sw, v));
}

#include "backend/cpu/simd_rows.inc"

const struct dsv4_kernels dsv4_kernels_avx512 = {
    .name     = "avx512",
    K_KERNEL_ENTRIES,
    K_ROW_ENTRIES,
};
