/*
 * vk_op_engram.c - the Vulkan backend's DeepSeek-V4.1 Engram ops (backend.h engram_rows,
 * engram_gate; shaders/engram_rows.comp, engram_gate.comp).
 *
 * engram_rows: the tables (200 GB for V4.1-Flash) stay the mapped checkpoint in host memory,
 * and the ids are host metadata (the host hashes the n-grams), so the host copies the codes
 * and scales of the rows a step names (a few KB a token) into host metadata and the shader
 * decodes them into the output. A row outside the table gets zero codes: +0, as the reference.
 */
#include <math.h>
#include <string.h>

#include "backend/vulkan/vk.h"

/* Copies the codes, then the scales, of the n x cols rows named into the metadata at codes /
 * scales (cols * d and cols * d / 32 bytes a position). */
static void gather(int n, int cols, const int64_t *ids, int ld, const uint8_t *table, const uint8_t *scale,
                   int64_t n_rows, int d, uint8_t *codes, uint8_t *scales)
{
    size_t D = (size_t)d, nb = D / 32;
    for (int r = 0; r < n; r++)
        for (int j = 0; j < cols; j++) {
            int64_t id = ids[(size_t)r * (size_t)ld + (size_t)j];
            size_t  k  = (size_t)r * (size_t)cols + (size_t)j;
            bool    in = id >= 0 && id < n_rows;
            if (in) memcpy(codes + k * D, table + (size_t)id * D, D);
            else memset(codes + k * D, 0, D);
            if (in) memcpy(scales + k * nb, scale + (size_t)id * nb, nb);
            else memset(scales + k * nb, 127, nb);
        }
}

void dsv4_vk_engram_rows(struct dsv4_backend *be, int n, int n_cols, const int64_t *ids, int ld_ids,
                         const uint8_t *table, const uint8_t *scale, int64_t n_rows, int d, float *out)
{
    struct dsv4_vk *v     = be->impl;
    uint64_t        total = (uint64_t)n * (uint64_t)n_cols * (uint64_t)d;
    if (!total) return;
    pthread_mutex_lock(&v->mu);
    size_t          code_bytes = (size_t)((total + 3) & ~(uint64_t)3), scale_bytes = (size_t)(total / 32);
    struct vk_bind  b[2] = { { 0 } };
    VkDeviceAddress at   = 0;
    dsv4_vk_meta_room(v, code_bytes + scale_bytes + 64);
    int64_t  o0 = dsv4_vk_arg(v, out, 4, (size_t)total * 4, &b[0]);
    uint8_t *m  = o0 >= 0 && dsv4_vk_fits_u32(v, total, "engram_rows") ? dsv4_vk_meta(v, code_bytes + scale_bytes, &b[1], &at)
                                                                       : NULL;
    if (m) {
        gather(n, n_cols, ids, ld_ids, table, scale, n_rows, d, m, m + code_bytes);
        struct { uint64_t codes, scales; uint32_t o0, total; } pc = { at, at + code_bytes, (uint32_t)o0, (uint32_t)total };
        dsv4_vk_dispatch(v, "engram_rows", b, 1, &pc, sizeof(pc), dsv4_vk_groups(total, 256), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_engram_gate(struct dsv4_backend *be, int n, int hc, int d, const float *kv, const float *w, double eps,
                         float *X)
{
    struct dsv4_vk *v      = be->impl;
    uint64_t        groups = (uint64_t)n * (uint64_t)hc, total = groups * (uint64_t)d;
    if (!total) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[3] = { { 0 } };
    size_t  kvb = (size_t)n * (size_t)(hc + 1) * (size_t)d * 4;
    int64_t k0 = dsv4_vk_arg(v, kv, 4, kvb, &b[0]), w0 = dsv4_vk_arg(v, w, 4, (size_t)hc * (size_t)d * 4, &b[1]);
    int64_t x0 = dsv4_vk_arg(v, X, 4, (size_t)total * 4, &b[2]);
    if (k0 >= 0 && w0 >= 0 && x0 >= 0 && dsv4_vk_fits_u32(v, kvb / 4 + (uint64_t)k0, "engram_gate") &&
        dsv4_vk_fits_u32(v, total + (uint64_t)x0, "engram_gate")) {
        struct { double eps; uint32_t kv0, w0, x0, n, hc, d; float dscale; } pc = {
            eps, (uint32_t)k0, (uint32_t)w0, (uint32_t)x0, (uint32_t)n, (uint32_t)hc, (uint32_t)d, (float)pow(d, -0.5)
        };
        dsv4_vk_dispatch(v, "engram_gate", b, 3, &pc, sizeof(pc), dsv4_vk_groups(groups, 1), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}
