/*
 * x86_avx512.c - the AVX-512 kernels (F, BW, VL, DQ + F16C): 16 lanes of the template in
 * simd_kernels.inc. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c;
 * only called when the CPU has them (cpu.c).
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

const struct dsv4_kernels dsv4_kernels_avx512 = {
    .name     = "avx512",
    K_KERNEL_ENTRIES,
    .fp4_sim_rows = dsv4_avx512_fp4_sim_rows,
    .sumsq_bf16   = dsv4_avx512_sumsq_bf16,
    .scale_bf16   = dsv4_avx512_scale_bf16,
    .swiglu_bf16  = dsv4_avx512_swiglu_bf16,
    .fp8_sim_rows = dsv4_avx512_fp8_sim_rows,
    .rmsnorm_row  = dsv4_avx512_rmsnorm_row,
    .rope_row     = dsv4_avx512_rope_row,
    .hadamard_rows = dsv4_avx512_hadamard_rows,
    .quant_f32     = dsv4_avx512_quant_f32,
    .bf16_to_f32   = dsv4_avx512_bf16_to_f32,
    .scale_rows    = dsv4_avx512_scale_rows,
    .add_rows      = dsv4_avx512_add_rows,
    .combine_row   = dsv4_avx512_combine_row,
};
