/*
 * row_codec.c - the compact lossless cache rows and indexer keys (backend.h), shared by the
 * model layer, the KV state and every backend: attention rows as e4m3 codes with e8m0
 * scales per 64 (plus the rope part in bf16) or as plain bf16, indexer keys as e2m1 codes
 * with e8m0 scales per 32; and the power-of-two activation scale of those formats.
 *
 * Scales are powers of two, 2^ceil(log2(max(amax, floor) * f32(1/qmax))) (docs/MODEL.md), so
 * x / s is exact and the only rounding is the cast to e4m3 / e2m1: a row that went through
 * the FP8 (or FP4) simulation is exactly code * scale, and storing codes and scales is
 * lossless (argued in docs/MODEL.md, checked by tests).
 */
#include <math.h>
#include <string.h>

#include "backend/backend.h"

static float block_amax(const float *x, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

float dsv4_act_scale(float amax, float qmax, float floor_)
{
    if (!(amax >= floor_)) amax = floor_; /* also catches NaN */
    return dsv4_pow2_ceil(amax * (1.0f / qmax));
}

void dsv4_row_encode(enum dsv4_row_fmt fmt, int d_head, int d_rope, const float *x, uint8_t *row)
{
    int d_nope = d_head - d_rope;
    if (fmt == DSV4_ROW_IDX_FP4) {
        dsv4_idx_key_encode(d_head, x, row);
        return;
    }
    if (fmt == DSV4_ROW_BF16) {
        for (int i = 0; i < d_head; i++) {
            uint16_t h = dsv4_bf16_from_f32(x[i]);
            memcpy(row + 2 * i, &h, 2);
        }
        return;
    }
    uint8_t *codes = row, *scales = row + d_nope, *rope = row + d_nope + d_nope / 64;
    for (int b = 0; b < d_nope; b += 64) {
        float s = dsv4_act_scale(block_amax(x + b, 64), 448.0f, 1e-4f);
        scales[b / 64] = dsv4_e8m0_from_f32(s);
        for (int i = b; i < b + 64; i++) codes[i] = dsv4_e4m3_from_f32(x[i] / s);
    }
    for (int i = 0; i < d_rope; i++) {
        uint16_t h = dsv4_bf16_from_f32(x[d_nope + i]);
        memcpy(rope + 2 * i, &h, 2);
    }
}

void dsv4_row_decode(enum dsv4_row_fmt fmt, int d_head, int d_rope, const uint8_t *row, float *x)
{
    int d_nope = d_head - d_rope;
    if (fmt == DSV4_ROW_IDX_FP4) {
        dsv4_idx_key_decode(d_head, row, x);
        return;
    }
    if (fmt == DSV4_ROW_BF16) {
        for (int i = 0; i < d_head; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            x[i] = dsv4_f32_from_bf16(h);
        }
        return;
    }
    const uint8_t *codes = row, *scales = row + d_nope, *rope = row + d_nope + d_nope / 64;
    for (int i = 0; i < d_nope; i++) x[i] = dsv4_f32_from_e4m3(codes[i]) * dsv4_f32_from_e8m0(scales[i / 64]);
    for (int i = 0; i < d_rope; i++) {
        uint16_t h;
        memcpy(&h, rope + 2 * i, 2);
        x[d_nope + i] = dsv4_f32_from_bf16(h);
    }
}

void dsv4_idx_key_encode(int d, const float *x, uint8_t *row)
{
    uint8_t *scales = row + d / 2;
    memset(row, 0, (size_t)d / 2);
    for (int b = 0; b < d; b += 32) {
        float s = dsv4_act_scale(block_amax(x + b, 32), 6.0f, 6.0f * 0x1p-126f);
        scales[b / 32] = dsv4_e8m0_from_f32(s);
        for (int i = b; i < b + 32; i++) {
            uint8_t c = dsv4_e2m1_from_f32(x[i] / s);
            row[i / 2] |= (uint8_t)(i % 2 ? c << 4 : c);
        }
    }
}

void dsv4_idx_key_decode(int d, const uint8_t *row, float *x)
{
    const uint8_t *scales = row + d / 2;
    for (int i = 0; i < d; i++) {
        uint8_t c = (uint8_t)(i % 2 ? row[i / 2] >> 4 : row[i / 2] & 15);
        x[i]      = dsv4_f32_from_e2m1(c) * dsv4_f32_from_e8m0(scales[i / 32]);
    }
}
