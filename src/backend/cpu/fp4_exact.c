/*
 * fp4_exact.c - the "-int" sub-levels' FP4 numerics in plain C (fp4_exact.h): the block-scale
 * table, the activation layout and the reference dot product the SIMD kernels
 * (x86_fp4_exact.c) are tested against bit for bit.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "backend/cpu/fp4_exact.h"

static float          sc_table[DSV4_FP4X_SC_LEN];
static pthread_once_t sc_once = PTHREAD_ONCE_INIT;
const float          *dsv4_fp4x_sc = sc_table;

static void sc_fill(void)
{
    for (int i = 0; i < DSV4_FP4X_SC_LEN; i++)
        sc_table[i] = (float)ldexp(1.0, i - DSV4_FP4X_SC_OFF - 128); /* 0 below 2^-149, inf above 2^127 */
}

void dsv4_fp4x_init(void)
{
    pthread_once(&sc_once, sc_fill);
}

/* Input of a 32-block at word p (0..15) of H0/L0. */
static int a_input(int p)
{
    return p < 8 ? 2 * p : 2 * (p - 8) + 1;
}

/* Input of a 32-block at F's vector j, lane d. */
static int f_input(int j, int d)
{
    static const int off[4] = { 0, 2, 16, 18 };
    return (d < 4 ? 4 * d : 4 * (d - 4) + 1) + off[j];
}

/* ex of a block of dequantised activations: ilogb of the largest magnitude, minus 17. */
static int block_ex(const float *x, int n)
{
    float amax = 0;
    for (int k = 0; k < n; k++) {
        float a = fabsf(x[k]);
        if (isfinite(a) && a > amax) amax = a;
    }
    return amax > 0 ? ilogbf(amax) - 17 : 0;
}

void dsv4_fp4x_layout_ref(const float *x, int n, int B, float *out)
{
    int16_t *A = (int16_t *)(void *)out;
    float   *F = out + dsv4_fp4x_f_off(n);
    int32_t *E = (int32_t *)(void *)(out + dsv4_fp4x_e_off(n));
    for (int g = 0; g < n; g += B) {
        int ex = block_ex(x + g, n - g < B ? n - g : B);
        for (int b = g; b < g + B && b < n; b += 32) E[b / 32] = ex;
    }
    for (int b = 0; b < n; b += 32) {
        int32_t xi[32];
        int     ex = E[b / 32];
        for (int k = 0; k < 32; k++) {
            double v = ldexp((double)x[b + k], -ex); /* exact: an integer below 2^18 */
            xi[k]    = isfinite(v) && fabs(v) < 262144.0 ? (int32_t)v : 0;
        }
        int16_t *blk = A + (size_t)b * 2;
        for (int p = 0; p < 16; p++) {
            int32_t u = xi[a_input(p)], v = xi[a_input(p) + 16];
            blk[p]      = (int16_t)(2 * (u >> 9));
            blk[16 + p] = (int16_t)(2 * (v >> 9));
            blk[32 + p] = (int16_t)(u & 511);
            blk[48 + p] = (int16_t)(v & 511);
        }
        for (int j = 0; j < 4; j++)
            for (int d = 0; d < 8; d++) F[b + 8 * j + d] = (float)xi[f_input(j, d)];
    }
}

/* xi of input k of a row in the layout, from A (256 H + L). */
static int32_t layout_xi(const float *row, int k)
{
    const int16_t *A   = (const int16_t *)(const void *)row + (size_t)(k / 32) * 64;
    int            i   = k % 32, hi = i >= 16, j = i & 15;
    int            p   = (j & 1) * 8 + j / 2; /* the word holding input j of H0 */
    return 256 * (int32_t)A[hi * 16 + p] + (int32_t)A[32 + hi * 16 + p];
}

void dsv4_fp4x_dot_ref(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y,
                       int ldy)
{
    dsv4_fp4x_init();
    int            K  = w->n_in, nb = K / 32;
    const uint8_t *sc = w->scale;
    for (int o = o0; o < o1; o++) {
        int            ow = o + w->row_off;
        const uint8_t *wr = (const uint8_t *)w->w + (size_t)ow * (size_t)(K / 2);
        for (int t = 0; t < nt; t++) {
            const float   *row = x + (size_t)t * (size_t)ldx;
            const int32_t *E   = (const int32_t *)(const void *)(row + dsv4_fp4x_e_off(K));
            float          a[8] = { 0 };
            for (int b = 0; b < nb; b++) {
                float s = dsv4_fp4x_sc[dsv4_fp4x_sc_index(sc[(size_t)ow * (size_t)nb + (size_t)b], E[b])];
                for (int d = 0; d < 8; d++) {
                    int32_t S = 0;
                    for (int j = 0; j < 4; j++) {
                        int     k    = b * 32 + f_input(j, d);
                        uint8_t code = (uint8_t)((wr[k / 2] >> (k % 2 * 4)) & 15);
                        int32_t w2   = (int32_t)(2.0f * dsv4_f32_from_e2m1(code));
                        S += w2 * layout_xi(row, k);
                    }
                    a[d] = fmaf((float)S, s, a[d]);
                }
            }
            y[(size_t)t * (size_t)ldy + (size_t)o] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        }
    }
}
