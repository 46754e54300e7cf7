/*
 * vk_ops.c - the Vulkan backend's op table: the ops written so far as compute shaders
 * (shaders/NAME.comp), the others NULL. A NULL entry is an op this backend does not run: the op
 * checker reports it `missing` and engine open refuses the backend, naming it (no op falls
 * back to the CPU).
 *
 * Each op resolves its addresses to (buffer, offset) in the block table (vk_mem.c), binds
 * each buffer from its offset rounded down to minStorageBufferOffsetAlignment and passes the
 * rest as an element index in the push constants; host metadata (token ids) goes through
 * the mapped metadata buffer. Then one dispatch, submitted without waiting: sync or the next
 * download waits.
 */
#include <string.h>

#include "backend/vulkan/vk.h"

enum { VKB_MAX_GROUPS = 65535 };

/* Binds address p (elements of `elem` bytes, `bytes` of them read or written) into *b and
 * returns its element index from the bound offset; -1 (and a fault) when p is not inside
 * one of the backend's buffers or not aligned to its element. */
static int64_t arg(struct dsv4_vk *v, const void *p, size_t elem, size_t bytes, struct vk_bind *b)
{
    VkDeviceSize           off;
    const struct vk_block *blk = dsv4_vk_resolve(v, p, &off);
    if (!blk || off + bytes > blk->len) {
        dsv4_vk_fault(v, "an op was given %p (%zu bytes), which is not inside one of its buffers", p, bytes);
        return -1;
    }
    VkDeviceSize base = off / v->sb_align * v->sb_align;
    if ((off - base) % elem) {
        dsv4_vk_fault(v, "an op was given %p, not aligned to its %zu-byte elements", p, elem);
        return -1;
    }
    *b = (struct vk_bind){ blk->buf, base };
    return (int64_t)((off - base) / elem);
}

static uint32_t groups_for(uint64_t items, uint32_t per_group)
{
    uint64_t g = (items + per_group - 1) / per_group;
    return g < 1 ? 1u : g > VKB_MAX_GROUPS ? (uint32_t)VKB_MAX_GROUPS : (uint32_t)g;
}

/* Records and submits one dispatch: under the lock, after the previous submission. */
static void run(struct dsv4_vk *v, enum vk_pipe_id id, const struct vk_bind *b, int n_bind, const void *pc,
                uint32_t pc_bytes, uint32_t groups)
{
    if (!dsv4_vk_begin(v)) return;
    dsv4_vk_dispatch(v, id, b, n_bind, pc, pc_bytes, groups);
    dsv4_vk_submit(v);
}

/* Element counts the shaders index with 32-bit integers. */
static bool fits_u32(struct dsv4_vk *v, uint64_t n, const char *op)
{
    if (n <= UINT32_MAX) return true;
    dsv4_vk_fault(v, "%s over %llu elements: more than the shader's 32-bit indices", op, (unsigned long long)n);
    return false;
}

static void vk_scale(struct dsv4_backend *be, size_t n, float *x, double s)
{
    struct dsv4_vk *v = be->impl;
    if (!n) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b = { 0 };
    int64_t        x0 = arg(v, x, 4, n * 4, &b);
    if (x0 >= 0 && fits_u32(v, n, "scale")) {
        struct { double s; uint32_t x0, n; } pc = { s, (uint32_t)x0, (uint32_t)n };
        run(v, VKB_PIPE_SCALE, &b, 1, &pc, sizeof(pc), groups_for(n, 256));
    }
    pthread_mutex_unlock(&v->mu);
}

static void vk_add_streams(struct dsv4_backend *be, int n, int hc, int d, const float *e, float *X)
{
    struct dsv4_vk *v     = be->impl;
    uint64_t        total = (uint64_t)n * (uint64_t)hc * (uint64_t)d;
    if (!total) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[2] = { { 0 } };
    int64_t        e0 = arg(v, e, 4, (size_t)n * (size_t)d * 4, &b[0]), x0 = arg(v, X, 4, total * 4, &b[1]);
    if (e0 >= 0 && x0 >= 0 && fits_u32(v, total, "add_streams")) {
        uint32_t pc[5] = { (uint32_t)e0, (uint32_t)x0, (uint32_t)n, (uint32_t)hc, (uint32_t)d };
        run(v, VKB_PIPE_ADD_STREAMS, b, 2, pc, sizeof(pc), groups_for(total, 256));
    }
    pthread_mutex_unlock(&v->mu);
}

/* Token ids are host metadata: copied into the mapped metadata buffer, which the shader reads. */
static void vk_embed(struct dsv4_backend *be, int n, const int *tok, const uint16_t *table, int d, int copies, float *X)
{
    struct dsv4_vk *v     = be->impl;
    uint64_t        total = (uint64_t)n * (uint64_t)copies * (uint64_t)d;
    if (!total) return;
    pthread_mutex_lock(&v->mu);
    dsv4_vk_wait(v); /* the metadata buffer may still be read by the submission in flight */
    struct vk_bind b[3] = { { v->meta.buf, 0 } };
    int64_t        x0   = arg(v, X, 4, total * 4, &b[2]);
    /* the table is read where the rows are; its extent is not known here: only its start is checked */
    int64_t t0 = arg(v, table, 2, 2, &b[1]);
    if ((size_t)n * sizeof(int) > v->meta.bytes) {
        dsv4_vk_fault(v, "embed of %d tokens: more than the metadata buffer holds", n);
    } else if (x0 >= 0 && t0 >= 0 && fits_u32(v, total, "embed")) {
        memcpy(v->meta.map, tok, (size_t)n * sizeof(int));
        uint32_t pc[6] = { 0, (uint32_t)t0, (uint32_t)x0, (uint32_t)n, (uint32_t)d, (uint32_t)copies };
        run(v, VKB_PIPE_EMBED, b, 3, pc, sizeof(pc), groups_for(total, 256));
    }
    pthread_mutex_unlock(&v->mu);
}

static void vk_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps,
                       float *y, int ldy)
{
    struct dsv4_vk *v = be->impl;
    if (n <= 0 || d <= 0) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[3] = { { 0 } };
    size_t         xb = ((size_t)(n - 1) * (size_t)ldx + (size_t)d) * 4, yb = ((size_t)(n - 1) * (size_t)ldy + (size_t)d) * 4;
    int64_t        x0 = arg(v, x, 4, xb, &b[0]), w0 = arg(v, w, 2, (size_t)d * 2, &b[1]), y0 = arg(v, y, 4, yb, &b[2]);
    if (x0 >= 0 && w0 >= 0 && y0 >= 0 && fits_u32(v, xb / 4 + (uint64_t)x0, "rmsnorm") &&
        fits_u32(v, yb / 4 + (uint64_t)y0, "rmsnorm")) {
        struct { double eps; uint32_t x0, w0, y0, n, d, ldx, ldy; } pc = {
            eps, (uint32_t)x0, (uint32_t)w0, (uint32_t)y0, (uint32_t)n, (uint32_t)d, (uint32_t)ldx, (uint32_t)ldy
        };
        run(v, VKB_PIPE_RMSNORM, b, 3, &pc, sizeof(pc), groups_for((uint64_t)n, 1));
    }
    pthread_mutex_unlock(&v->mu);
}

const struct dsv4_backend_ops dsv4_vk_ops = {
    .name        = "vulkan",
    .rmsnorm     = vk_rmsnorm,
    .embed       = vk_embed,
    .scale       = vk_scale,
    .add_streams = vk_add_streams,
};
