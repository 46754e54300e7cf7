/*
 * vk_op_kv.c - the whole-step ops that write the sequences' state: store_rows
 * (shaders/store_rows.comp: rows encoded into staging rows, rings or pages) and compress
 * (shaders/compress.comp: the compressor's frontiers in each slot and the pooled rows). Each
 * is one dispatch over the whole step; the shaders reach slots and pages through the
 * descriptor step_begin uploaded (vk_op_step.c).
 */
#include "backend/vulkan/vk.h"

enum { VKB_MAX_ROW_BYTES = 2048 }; /* store_rows.comp's shared row */

/* The rows compress writes (and store_rows' BLOCKS reads): every sequence's blocks. */
static int step_blocks(const struct dsv4_step_desc *d, int ratio)
{
    int n = 0;
    for (int s = 0; s < d->n_seqs; s++) n += dsv4_step_blocks(d, s, ratio);
    return n;
}

void dsv4_vk_store_rows(struct dsv4_backend *be, const struct dsv4_step_desc *desc, enum dsv4_row_fmt fmt, int d,
                        int d_rope, const float *x, int ldx, const struct dsv4_store_dst *dst)
{
    struct dsv4_vk *v = be->impl;
    int n = dst->to == DSV4_STORE_BLOCKS ? step_blocks(desc, dst->ratio) : desc->n_rows;
    if (n <= 0) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind  b;
    VkDeviceAddress step = dsv4_vk_step_addr(v, desc, "store_rows"), to = dst->off;
    if (dst->to == DSV4_STORE_STEP) to = dsv4_vk_addr(v, dst->rows, (size_t)n * (size_t)dst->row_bytes);
    int64_t x0 = dsv4_vk_arg(v, x, 4, ((size_t)(n - 1) * (size_t)ldx + (size_t)d) * 4, &b);
    if (dst->row_bytes != dsv4_row_bytes(fmt, d, d_rope) || dst->row_bytes > VKB_MAX_ROW_BYTES || d > 2048)
        dsv4_vk_fault(v, "store_rows: rows of %d bytes (d %d): not what the shader encodes", dst->row_bytes, d);
    else if (step && (to || dst->to != DSV4_STORE_STEP) && x0 >= 0) { /* an offset in a slot or page may be 0 */
        struct {
            uint64_t step, dst;
            uint32_t x0, ldx, mode, fmt, d, dr, row_bytes, window, ring_rows, ratio, n;
        } pc = { step, to, (uint32_t)x0, (uint32_t)ldx, (uint32_t)dst->to, (uint32_t)fmt, (uint32_t)d, (uint32_t)d_rope,
                 (uint32_t)dst->row_bytes, (uint32_t)dst->window, (uint32_t)dst->ring_rows, (uint32_t)dst->ratio,
                 (uint32_t)n };
        dsv4_vk_dispatch(v, "store_rows", &b, 1, &pc, sizeof(pc), dsv4_vk_groups((uint64_t)n, 1), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_compress(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, bool overlap, int d,
                      const float *a, const float *g, const float *ape, size_t kv_off, size_t sc_off, float *out)
{
    struct dsv4_vk *v = be->impl;
    if (desc->n_rows <= 0 || desc->n_seqs <= 0 || d <= 0) return;
    int    blocks = step_blocks(desc, ratio);
    size_t w = (size_t)(overlap ? 2 : 1) * (size_t)d, rows = (size_t)desc->n_rows * w * 4;
    pthread_mutex_lock(&v->mu);
    struct vk_bind  b[4];
    VkDeviceAddress step = dsv4_vk_step_addr(v, desc, "compress");
    int64_t a0 = dsv4_vk_arg(v, a, 4, rows, &b[0]), g0 = dsv4_vk_arg(v, g, 4, rows, &b[1]);
    int64_t e0 = dsv4_vk_arg(v, ape, 4, (size_t)ratio * w * 4, &b[2]);
    /* a step that completes no block writes nothing: any address of out binds */
    int64_t o0 = dsv4_vk_arg(v, out, 4, (size_t)(blocks > 0 ? blocks : 1) * (size_t)d * 4, &b[3]);
    if (step && a0 >= 0 && g0 >= 0 && e0 >= 0 && o0 >= 0 && desc->n_seqs <= 65535) {
        struct {
            uint64_t step, kv_off, sc_off;
            uint32_t a0, g0, e0, o0, ratio, d, overlap;
        } pc = { step, kv_off, sc_off, (uint32_t)a0, (uint32_t)g0, (uint32_t)e0, (uint32_t)o0, (uint32_t)ratio,
                 (uint32_t)d, overlap ? 1u : 0u };
        dsv4_vk_dispatch(v, "compress", b, 4, &pc, sizeof(pc), (uint32_t)(d + 63) / 64, (uint32_t)desc->n_seqs, 1);
    }
    pthread_mutex_unlock(&v->mu);
}
