/*
 * fp4_exact.h - the numerics of the "-int" sub-levels' FP4 projections (avx2-int, avx512-int), shared by
 * their kernels (x86_fp4_exact.c, x86_fp4_exact512.c), their plain-C reference and activation layout
 * (fp4_exact.c), the fast ops (ops_fast.c) and the tests.
 *
 * Why: an FP4 row has e2m1 weights with an e8m0 scale per 32 inputs, and its activations are
 * e4m3 codes with a power-of-two scale per group of B = w->block (128 for V4, 32 for V4.1;
 * docs/MODEL.md §R5.2-R5.3), so every product
 * of a weight and an activation is exact and a few of them sum exactly. The default levels
 * round after every product (one f32 FMA each); these levels sum exactly and round once per
 * block and lane, which lets the one-token GEMV run on integer dot products (VPMADDWD, or
 * VPDPWSSD with AVX-VNNI / AVX-512 VNNI) with a one-byte-shuffle decode of the nibbles, and
 * the many-token GEMM on f32 FMAs, with the same bits (docs/PERF.md, "The avx2-int and
 * avx512-int sub-levels").
 *
 * The numerics, for output row o and token t (the definition every path computes):
 *   - w2[k] = 2 x e2m1 code value, an integer in [-12, 12];
 *   - per activation group of B (the last may be short): ex = ilogb(amax) - 17 of the
 *     dequantised values (0 when all are zero), and xi[k] = x[k] / 2^ex, an integer with
 *     |xi| < 2^18 (x is an e4m3 value times a power of two, so a multiple of 2^ex);
 *   - eight f32 lane accumulators a[0..7], +0 at the start; for each 32-block b in order and
 *     each lane d: S = sum of w2[k] xi[k] over the lane's four inputs k in G(d) (below), an
 *     exact integer (|S| < 2^24), and a[d] = fmaf(S, sc(e_w[b] + ex), a[d]) with
 *     sc(i) = 2^(i - 128) (e_w the block's e8m0 byte; the 2^-1 of w2 is in the 128), one
 *     rounding per block and lane;
 *   - y = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) in f32.
 *   G(d) = { 4d, 4d + 2, 4d + 16, 4d + 18 } for d < 4 and { 4e + 1, 4e + 3, 4e + 17, 4e + 19 }
 *   with e = d - 4 for d >= 4: the lanes VPMADDWD gives on the one-shuffle decode.
 * Every partial sum of a lane is an exact integer below 2^24 in any order, so the result does
 * not depend on the token count, the chunk or the path: batch and chunk invariance hold by
 * construction.
 *
 * The activation row layout (one token, n inputs, n % 32 == 0), written by the level's
 * quant_fp4x and read by its dot_fp4, dsv4_fp4x_floats(n) floats:
 *   int16 A[n / 32][64]: per block [H0 H1 L0 L1], 16 each; word p of H0/L0 is input
 *       p < 8 ? 2p : 2(p - 8) + 1 of the block, H1/L1 the same + 16; H = 2 (xi >> 9),
 *       L = xi & 511 (so xi = 256 H + L);
 *   float F[n / 32][32]: xi as floats, vector j (8 lanes) lane d holding input
 *       base(d) + {0, 2, 16, 18}[j], base(d) = d < 4 ? 4d : 4(d - 4) + 1 (the GEMM's order);
 *   int32 E[n / 32]: each 32-block's ex (that of the group it lies in; B is a multiple of
 *       32), so the dot kernels read E[b] whatever the group.
 */
#ifndef DSV4_FP4_EXACT_H
#define DSV4_FP4_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* Floats of one token's activation row in the layout (A, F, E). */
static inline size_t dsv4_fp4x_floats(int n)
{
    return 2 * (size_t)n + (size_t)(n + 31) / 32;
}

/* Offsets of F and E in the row, in floats. */
static inline size_t dsv4_fp4x_f_off(int n) { return (size_t)n; }
static inline size_t dsv4_fp4x_e_off(int n) { return 2 * (size_t)n; }

/* sc(i) = 2^(i - 128) for i = e_w + ex (0 below 2^-149, inf above 2^127): the one table every
 * path takes the block scale from. The layout writers keep ex in [-166, 110] (ilogb of a
 * finite float, minus 17), so e_w + ex + DSV4_FP4X_SC_OFF lies in [154, 685] and the kernels
 * index the table directly; dsv4_fp4x_sc_index (the reference's) also clamps, which rows from
 * those writers never need. */
enum { DSV4_FP4X_SC_OFF = 320, DSV4_FP4X_SC_LEN = 2 * DSV4_FP4X_SC_OFF + 256 };
extern const float *dsv4_fp4x_sc;   /* [DSV4_FP4X_SC_LEN], index i + DSV4_FP4X_SC_OFF */
void dsv4_fp4x_init(void);          /* fills the table; idempotent, thread-safe (pthread_once) */

static inline int dsv4_fp4x_sc_index(int e_w, int ex)
{
    int i = e_w + ex + DSV4_FP4X_SC_OFF;
    return i < 0 ? 0 : i >= DSV4_FP4X_SC_LEN ? DSV4_FP4X_SC_LEN - 1 : i;
}

/* The layout of one row of n dequantised activations (e4m3 values times a power of two per
 * group of B; n % 32 == 0, B % 32 == 0) in plain C: the reference the SIMD writers are tested against. Non-finite
 * inputs are written as 0. */
void dsv4_fp4x_layout_ref(const float *x, int n, int B, float *out);

/* The numerics above in plain C (integers and fmaf), rows [o0, o1) of an FP4 projection with
 * e8m0 scales against nt activation rows in the layout (stride ldx floats). */
void dsv4_fp4x_dot_ref(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y,
                       int ldy);

#endif
