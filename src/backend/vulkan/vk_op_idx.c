/*
 * vk_op_idx.c - the lightning indexer: indexer_scores (shaders/idx_scores.comp, mode 0) and
 * indexer_topk (idx_scores.comp mode 1 for every row of the step that must choose, then
 * shaders/idx_topk.comp). The top-k's scores wait in the step's work space (vk_op_step.c),
 * a row's completed keys each; a step whose rows need more than VKB_TOPK_WORK bytes of it
 * runs in pieces of rows, one after the other in the command buffer.
 */
#include "backend/vulkan/vk.h"

enum { VKB_TOPK_WORK = 64 << 20, VKB_IDX_MAX_D = 1024, VKB_IDX_MAX_HEADS = 256 };

/* idx_scores.comp's push constants */
struct idx_pc {
    uint64_t step, keys, page_bytes;
    uint32_t mode, q0, w0, pg0, o0, n_head, d, page_rows, key_bytes, n_keys, r0, nr, topk, ratio;
};

static bool idx_shape_ok(struct dsv4_vk *v, int n_head, int d, const char *op)
{
    if (n_head <= VKB_IDX_MAX_HEADS && d <= VKB_IDX_MAX_D && d % 32 == 0) return true;
    dsv4_vk_fault(v, "%s: %d heads of %d: more than the shader holds", op, n_head, d);
    return false;
}

void dsv4_vk_indexer_scores(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                            const struct dsv4_kv_rows *keys, int n_keys, float *score)
{
    struct dsv4_vk *v = be->impl;
    if (n_keys <= 0) return;
    int n_pages = (n_keys + keys->page_rows - 1) / keys->page_rows;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[4];
    dsv4_vk_meta_room(v, (size_t)n_pages * 4);
    VkDeviceAddress pool = dsv4_vk_addr(v, keys->base, 1);
    int64_t q0 = dsv4_vk_arg(v, q, 4, (size_t)n_head * (size_t)d * 4, &b[0]), w0 = dsv4_vk_arg(v, w, 4, (size_t)n_head * 4, &b[1]);
    int64_t o0 = dsv4_vk_arg(v, score, 4, (size_t)n_keys * 4, &b[3]);
    int64_t p0 = q0 >= 0 && w0 >= 0 && o0 >= 0 ? dsv4_vk_in(v, keys->page, 4, (size_t)n_pages * 4, &b[2]) : -1;
    if (pool && p0 >= 0 && idx_shape_ok(v, n_head, d, "indexer_scores")) {
        struct idx_pc pc = { 0, pool + keys->off, keys->page_bytes, 0, (uint32_t)q0, (uint32_t)w0, (uint32_t)p0,
                             (uint32_t)o0, (uint32_t)n_head, (uint32_t)d, (uint32_t)keys->page_rows,
                             (uint32_t)keys->row_bytes, (uint32_t)n_keys, 0, 1, 0, 0 };
        dsv4_vk_dispatch(v, "idx_scores", b, 4, &pc, sizeof(pc), dsv4_vk_groups((uint64_t)n_keys, 1), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

/* idx_topk.comp's push constants */
struct topk_pc {
    uint64_t step;
    uint32_t sc0, stride, sel0, nsel0, r0, nr, topk, ratio;
    uint32_t cmode, cblock, n_keep, cand0, bs0;
};

/* Rows r0 .. r0 + nr: their scores into the work space (bound in wb), then their choice;
 * selb: sel, n_sel and the candidate blocks (or sel again without). */
static void topk_piece(struct dsv4_vk *v, struct idx_pc pc, struct topk_pc tc, const struct vk_bind *qwb,
                       const struct vk_bind *wb, const struct vk_bind *selb)
{
    struct vk_bind b[4] = { qwb[0], qwb[1], qwb[0], *wb }; /* binding 2 (the page table) is not read */
    if (tc.cmode) pc.topk = 0; /* candidates need every row's scores */
    dsv4_vk_dispatch(v, "idx_scores", b, 4, &pc, sizeof(pc), dsv4_vk_groups(tc.bs0, 1), pc.nr, 1);
    struct vk_bind t[4] = { *wb, selb[0], selb[1], selb[2] };
    tc.sc0 = pc.o0, tc.r0 = pc.r0, tc.nr = pc.nr;
    dsv4_vk_dispatch(v, "idx_topk", t, 4, &tc, sizeof(tc), dsv4_vk_groups(pc.nr, 1), 1, 1);
}

void dsv4_vk_step_reserve(struct dsv4_vk *v, const struct dsv4_plan_dims *dims)
{
    /* what indexer_topk below asks for is at most both */
    int    keys   = dims->idx_ratio > 0 ? dims->max_ctx / dims->idx_ratio : 0;
    size_t stride = (size_t)(keys > 1 ? keys : 1), rows = (size_t)dims->max_rows;
    size_t bytes  = rows * stride * 4 < (size_t)VKB_TOPK_WORK ? rows * stride * 4 : (size_t)VKB_TOPK_WORK;
    if (rows && dims->n_idx_head > 0 && dims->idx_ratio > 0) dsv4_vk_step_work(v, bytes);
}

/* The widest row's completed keys (at least 1). */
static int max_done(const struct dsv4_step_desc *desc, int ratio)
{
    int m = 1;
    for (int s = 0; s < desc->n_seqs; s++) {
        int done = (desc->seq[s].p0 + desc->seq[s].n) / ratio;
        if (desc->seq[s].n && done > m) m = done;
    }
    return m;
}

void dsv4_vk_indexer_topk(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, int n_head, int d,
                          const float *q, const float *w, size_t keys_off, int key_bytes, int topk, int *sel,
                          int *n_sel, const struct dsv4_idx_cand *cand)
{
    struct dsv4_vk *v = be->impl;
    int             n = desc->n_rows, keys = max_done(desc, ratio);
    if (n <= 0 || topk <= 0) return;
    /* a row's scores, then (a candidate source) its blocks' */
    int   stride = keys + (cand && cand->pick ? (keys + cand->block - 1) / cand->block : 0);
    int   per    = VKB_TOPK_WORK / (stride * 4) < 1 ? 1 : VKB_TOPK_WORK / (stride * 4);
    per          = per < n ? per : n;
    per          = per < 65535 ? per : 65535; /* the scores' grid: a row each in y */
    void *work   = dsv4_vk_step_work(v, (size_t)per * (size_t)stride * 4);
    pthread_mutex_lock(&v->mu);
    struct vk_bind  qw[2], wb, sb[3];
    VkDeviceAddress step = dsv4_vk_step_addr(v, desc, "indexer_topk");
    int64_t q0 = dsv4_vk_arg(v, q, 4, (size_t)n * (size_t)n_head * (size_t)d * 4, &qw[0]);
    int64_t w0 = dsv4_vk_arg(v, w, 4, (size_t)n * (size_t)n_head * 4, &qw[1]);
    int64_t s0 = dsv4_vk_arg(v, sel, 4, (size_t)n * (size_t)topk * 4, &sb[0]), n0 = dsv4_vk_arg(v, n_sel, 4, (size_t)n * 4, &sb[1]);
    int64_t o0 = work ? dsv4_vk_arg(v, work, 4, (size_t)per * (size_t)stride * 4, &wb) : -1;
    int64_t c0 = cand ? dsv4_vk_arg(v, cand->blocks, 4, (size_t)n * (size_t)cand->n_keep * 4, &sb[2]) : 0;
    if (!cand) sb[2] = sb[0]; /* not read */
    if (step && q0 >= 0 && w0 >= 0 && s0 >= 0 && n0 >= 0 && o0 >= 0 && c0 >= 0 &&
        idx_shape_ok(v, n_head, d, "indexer_topk"))
        for (int r0 = 0; r0 < n; r0 += per) {
            uint32_t      nr = (uint32_t)(n - r0 < per ? n - r0 : per);
            struct idx_pc pc = { step, keys_off, 0, 1, (uint32_t)q0, (uint32_t)w0, 0, (uint32_t)o0, (uint32_t)n_head,
                                 (uint32_t)d, 0, (uint32_t)key_bytes, (uint32_t)stride, (uint32_t)r0, nr,
                                 (uint32_t)topk, (uint32_t)ratio };
            struct topk_pc tc = { step, 0, (uint32_t)stride, (uint32_t)s0, (uint32_t)n0, 0, 0, (uint32_t)topk,
                                  (uint32_t)ratio, cand ? (cand->pick ? 1u : 2u) : 0u,
                                  cand ? (uint32_t)cand->block : 1u, cand ? (uint32_t)cand->n_keep : 0u,
                                  (uint32_t)c0, (uint32_t)keys };
            topk_piece(v, pc, tc, qw, &wb, sb);
        }
    pthread_mutex_unlock(&v->mu);
}
