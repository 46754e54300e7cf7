/*
 * x86_avx2.c - the AVX2 kernels (AVX2 + FMA + F16C): 8 lanes of the template in
 * simd_kernels.inc. The level valgrind can run (DSV4_CPU=avx2).
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

const struct dsv4_kernels dsv4_kernels_avx2 = {
    .name     = "avx2",
    K_KERNEL_ENTRIES,
    .fp4_sim_rows  = dsv4_avx2_fp4_sim_rows,
    .sumsq_bf16    = dsv4_avx2_sumsq_bf16,
    .scale_bf16    = dsv4_avx2_scale_bf16,
    .swiglu_bf16   = dsv4_avx2_swiglu_bf16,
    .fp8_sim_rows  = dsv4_avx2_fp8_sim_rows,
    .rmsnorm_row   = dsv4_avx2_rmsnorm_row,
    .rope_row      = dsv4_avx2_rope_row,
    .hadamard_rows = dsv4_avx2_hadamard_rows,
    .quant_f32     = dsv4_avx2_quant_f32,
    .bf16_to_f32   = dsv4_avx2_bf16_to_f32,
    .scale_rows    = dsv4_avx2_scale_rows,
    .add_rows      = dsv4_avx2_add_rows,
    .combine_row   = dsv4_avx2_combine_row,
};
