/*
 * vk_op_attn.c - attention (shaders/attention.comp): one dispatch over the step, a workgroup
 * per (row, head). The rows a query reads are found in the shader (the descriptor of
 * step_begin, the ring in the slot, the step's staging rows, the page table); their scores
 * wait in shared memory, which bounds the rows one query reads (VKB_ATTN_MAX_ROWS, checked
 * here from the step's positions and the selection's stride).
 */
#include "backend/vulkan/vk.h"

enum { VKB_ATTN_MAX_ROWS = 6144 }; /* attention.comp's MAXS */

/* The most rows a query of the step may read. */
static int max_rows(const struct dsv4_step_desc *desc, const struct dsv4_attn_src *src)
{
    int last = 0;
    for (int s = 0; s < desc->n_seqs; s++)
        if (desc->seq[s].n && desc->seq[s].p0 + desc->seq[s].n > last) last = desc->seq[s].p0 + desc->seq[s].n;
    int comp = src->sel ? src->sel_stride : src->ratio ? last / src->ratio : 0;
    int wide = 0; /* a draft block's window is its chunk wider */
    for (int s = 0; src->block && s < desc->n_seqs; s++)
        if (desc->seq[s].n > wide) wide = desc->seq[s].n;
    return (last < src->window + wide ? last : src->window + wide) + comp;
}

void dsv4_vk_attention(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int n_head, int d_head, int d_rope,
                       const float *q, const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, const float *sink,
                       float scale, float *o)
{
    struct dsv4_vk *v = be->impl;
    int             n = desc->n_rows;
    if (n <= 0 || n_head <= 0) return;
    size_t hd = (size_t)n * (size_t)n_head * (size_t)d_head * 4;
    pthread_mutex_lock(&v->mu);
    struct vk_bind  b[5];
    VkDeviceAddress step  = dsv4_vk_step_addr(v, desc, "attention");
    VkDeviceAddress chunk = dsv4_vk_addr(v, src->chunk, (size_t)n * (size_t)src->row_bytes);
    int64_t q0 = dsv4_vk_arg(v, q, 4, hd, &b[0]), k0 = dsv4_vk_arg(v, sink, 4, (size_t)n_head * 4, &b[1]);
    int64_t s0 = 0, n0 = 0, o0 = dsv4_vk_arg(v, o, 4, hd, &b[4]);
    if (src->sel) {
        s0 = dsv4_vk_arg(v, src->sel, 4, (size_t)n * (size_t)src->sel_stride * 4, &b[2]);
        n0 = dsv4_vk_arg(v, src->n_sel, 4, (size_t)n * 4, &b[3]);
    } else {
        b[2] = b[3] = b[1]; /* not read */
    }
    if (max_rows(desc, src) > VKB_ATTN_MAX_ROWS)
        dsv4_vk_fault(v, "attention over up to %d rows a query: more than the shader's %d", max_rows(desc, src),
                      VKB_ATTN_MAX_ROWS);
    else if (step && chunk && q0 >= 0 && k0 >= 0 && s0 >= 0 && n0 >= 0 && o0 >= 0 && n_head <= 65535) {
        struct {
            uint64_t step, chunk, ring_off, comp_off;
            uint32_t q0, sink0, sel0, nsel0, o0, has_sel, sel_stride, n_head, d, dr, window, ratio, ring_rows, row_bytes,
                fmt, block;
            float scale;
        } pc = { step, chunk, src->ring_off, src->comp_off, (uint32_t)q0, (uint32_t)k0, (uint32_t)s0, (uint32_t)n0,
                 (uint32_t)o0, src->sel != NULL, (uint32_t)src->sel_stride, (uint32_t)n_head, (uint32_t)d_head,
                 (uint32_t)d_rope, (uint32_t)src->window, (uint32_t)src->ratio, (uint32_t)src->ring_rows,
                 (uint32_t)src->row_bytes, (uint32_t)fmt, src->block, scale };
        dsv4_vk_dispatch(v, "attention", b, 5, &pc, sizeof(pc), dsv4_vk_groups((uint64_t)n, 1), (uint32_t)n_head, 1);
    }
    pthread_mutex_unlock(&v->mu);
}
