/*
 * repack.c - projection weights as interleaved 16-row tiles ("i16") for the AVX512-BF16
 * kernels, made once at load.
 *
 * Layout: rows in groups of 16 (the last padded with zero rows); within group g, input pair p
 * (inputs 2p, 2p+1) of the 16 rows side by side, lane r = row 16g + r:
 *   FP8   bytes  [g][p][r][2]  = codes of w[16g+r][2p], w[16g+r][2p+1]   (32 bytes per (g, p))
 *   BF16  uint16 [g][p][r][2]  likewise                                   (64 bytes per (g, p))
 *   FP4   bytes  [g][p][r]     = the release's byte w[16g+r][p] (low nibble input 2p)
 * and FP4's per-32 scales as bytes [g][n_in/32][r] (padding rows: 127, i.e. 2^0). FP8 keeps
 * its BxB block scales as released (B = l->block, 128 or 32): a group lies inside one block.
 *
 * Why: one register then holds 16 outputs' worth of weights for one input pair, so a kernel
 * accumulates 16 outputs per register with the activation pair broadcast (VDPBF16PS), the
 * same order of operations whether one token or a thousand share the call: decode and
 * prefill give the same bits, and the prefill GEMM needs little operand bandwidth.
 */
#include <string.h>

#include "backend/cpu/cpu.h"

bool dsv4_i16_eligible(const struct dsv4_linear *l)
{
    if (l->n_in % 32 != 0 || l->n_out < 1 || l->row_off != 0) return false;
    if (l->fmt == DSV4_WFMT_BF16) return true;
    if ((l->fmt != DSV4_WFMT_FP8 && l->fmt != DSV4_WFMT_FP4) || l->scale_f32 || !l->scale) return false;
    if (l->fmt == DSV4_WFMT_FP8 && l->block % 16) return false; /* a 16-row group in one block */
    /* the kernels fold scales into bf16 exponents: every scale must keep bf16 weights normal */
    size_t         n = l->fmt == DSV4_WFMT_FP8 ? dsv4_fp8_scale_index(l, l->n_out - 1, l->n_in - 1) + 1
                                               : (size_t)l->n_out * (size_t)(l->n_in / 32);
    const uint8_t *s = l->scale;
    for (size_t i = 0; i < n; i++)
        if ((unsigned)s[i] - 10u > 230u) return false;
    return true;
}

int dsv4_i16_groups(const struct dsv4_linear *l)
{
    return (l->n_out + 15) / 16;
}

void dsv4_i16_sizes(const struct dsv4_linear *l, size_t *w_bytes, size_t *s_bytes)
{
    size_t g = (size_t)dsv4_i16_groups(l), K = (size_t)l->n_in;
    *w_bytes = l->fmt == DSV4_WFMT_BF16 ? g * 16 * K * 2 : l->fmt == DSV4_WFMT_FP8 ? g * 16 * K : g * 16 * K / 2;
    *s_bytes = l->fmt == DSV4_WFMT_FP4 ? g * 16 * (K / 32) : 0;
}

void dsv4_i16_pack(const struct dsv4_linear *l, int g0, int g1, void *wi, void *si)
{
    size_t         K = (size_t)l->n_in, P = K / 2;
    const uint8_t *src = l->w;
    for (int g = g0; g < g1; g++)
        for (int r = 0; r < 16; r++) {
            size_t row  = (size_t)g * 16 + (size_t)r;
            bool   real = row < (size_t)l->n_out;
            switch (l->fmt) {
            case DSV4_WFMT_FP8: {
                uint8_t *d = (uint8_t *)wi + (size_t)g * P * 32 + (size_t)r * 2;
                for (size_t p = 0; p < P; p++) {
                    d[p * 32]     = real ? src[row * K + 2 * p] : 0;
                    d[p * 32 + 1] = real ? src[row * K + 2 * p + 1] : 0;
                }
                break;
            }
            case DSV4_WFMT_BF16: {
                uint8_t *d = (uint8_t *)wi + ((size_t)g * P * 16 + (size_t)r) * 4;
                for (size_t p = 0; p < P; p++) {
                    if (real) memcpy(d + p * 64, src + (row * K + 2 * p) * 2, 4);
                    else memset(d + p * 64, 0, 4);
                }
                break;
            }
            default: { /* FP4 */
                uint8_t *d = (uint8_t *)wi + (size_t)g * P * 16 + (size_t)r;
                for (size_t p = 0; p < P; p++) d[p * 16] = real ? src[row * P + p] : 0;
                size_t         nb = K / 32;
                const uint8_t *ss = l->scale;
                uint8_t       *ds = (uint8_t *)si + (size_t)g * nb * 16 + (size_t)r;
                for (size_t b = 0; b < nb; b++) ds[b * 16] = real ? ss[row * nb + b] : 127;
                break;
            }
            }
        }
}

size_t dsv4_i16_export(const struct dsv4_linear *l, size_t parts[2], void *buf)
{
    parts[0] = parts[1] = 0;
    if (!l->wt || !dsv4_i16_eligible(l)) return 0; /* stored beside a tensor: a whole one */
    size_t wb, sb;
    dsv4_i16_sizes(l, &wb, &sb);
    parts[0] = wb;
    parts[1] = l->st ? sb : 0;
    if (buf) dsv4_i16_pack(l, 0, dsv4_i16_groups(l), buf, sb ? (uint8_t *)buf + wb : NULL);
    return wb + sb;
}
