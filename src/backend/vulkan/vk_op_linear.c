/*
 * vk_op_linear.c - the op linear on the device (shaders/linear.comp, act_quant.comp) and
 * the two dispatches the MoE ops build on: a grouped projection (dsv4_vk_gemm: every group of
 * a moe_dispatch group table against its expert's weight, or one group for a plain linear)
 * and the FP8 activation quantisation.
 *
 * Everything is reached through buffer device addresses: weights may be longer than one
 * storage binding reaches, and an experts' dispatch reads each group's weight through a
 * table of pointers. A projection's weight is its prepared copy (vk_weights.c); one that was
 * not prepared cannot be read by the device, which is a fault.
 */
#include <string.h>

#include <stddef.h>

#include "backend/vulkan/vk.h"

enum { VKL_ROWS = 4, VKL_ROWS1 = 32 }; /* output rows a workgroup takes (ROWS of linear.comp, linear1.comp) */

bool dsv4_vk_gemm(struct dsv4_vk *v, const struct vk_gemm *g, uint32_t groups)
{
    if (!g->tab || !g->grp || !g->x || !g->y) return false;
    uint32_t rows = g->max_rows == 1 ? VKL_ROWS1 : VKL_ROWS;
    uint32_t gx   = dsv4_vk_groups((g->n_out + rows - 1) / rows, 1);
    /* the push constants are the struct up to max_rows */
    return dsv4_vk_dispatch(v, g->max_rows == 1 ? "linear1" : "linear", NULL, 0, g,
                            (uint32_t)offsetof(struct vk_gemm, max_rows), gx, groups < g->n_exp ? groups : g->n_exp, 1);
}

bool dsv4_vk_act_quant(struct dsv4_vk *v, VkDeviceAddress x, uint32_t ldx, VkDeviceAddress q, uint32_t ldq,
                       uint32_t rows, uint32_t n_in)
{
    if (!x || !q) return false;
    struct { VkDeviceAddress x, q; uint32_t ldx, ldq, rows, n_in; } pc = { x, q, ldx, ldq, rows, n_in };
    uint64_t blocks = (uint64_t)rows * ((n_in + 127) / 128);
    return dsv4_vk_dispatch(v, "act_quant", NULL, 0, &pc, sizeof(pc), dsv4_vk_groups(blocks, 64), 1, 1);
}

/* The widest input of a projection and the most rows one takes (a step's rows, or its
 * routed pairs for the experts' gathered rows): linear's quantised activations. */
size_t dsv4_vk_linear_scratch(const struct dsv4_plan_dims *d)
{
    size_t k = (size_t)d->d_model, rows = (size_t)d->max_rows * (size_t)(d->n_exp_used > 1 ? d->n_exp_used : 1);
    size_t widths[] = { (size_t)d->q_lora_rank, (size_t)d->n_head * (size_t)d->d_head,
                        (size_t)d->o_groups * (size_t)d->o_lora_rank, (size_t)d->d_ff_exp };
    for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++) k = widths[i] > k ? widths[i] : k;
    return rows * k;
}

/* A group table of one group over rows [0, n) and a table of one descriptor pointer, in the
 * metadata area: what a plain projection passes to the grouped dispatch. */
static bool one_group(struct dsv4_vk *v, const struct vk_lin_prep *P, int n, struct vk_gemm *g)
{
    struct vk_bind b;
    int           *grp = dsv4_vk_meta(v, 4 * sizeof(int), &b, &g->grp);
    uint64_t      *tab = grp ? dsv4_vk_meta(v, 3 * sizeof(uint64_t), &b, &g->tab) : NULL;
    if (!tab) return false;
    grp[0] = 1, grp[1] = 0, grp[2] = 0, grp[3] = n;
    tab[0] = tab[1] = tab[2] = dsv4_vk_addr(v, P->desc_at, sizeof(P->d));
    g->n_exp = 1;
    return tab[0] != 0;
}

void dsv4_vk_linear(struct dsv4_backend *be, const struct dsv4_linear *w, int n_tok, const float *x, int ldx,
                    float *y, int ldy, enum dsv4_act act, enum dsv4_out out)
{
    struct dsv4_vk *v = be->impl;
    if (n_tok <= 0 || w->n_out <= 0) return;
    pthread_mutex_lock(&v->mu);
    const struct vk_lin_prep *P = w->prep;
    size_t xb = ((size_t)(n_tok - 1) * (size_t)ldx + (size_t)w->n_in) * 4;
    size_t yb = ((size_t)(n_tok - 1) * (size_t)ldy + (size_t)w->n_out) * 4;
    size_t qn = (size_t)n_tok * (size_t)w->n_in;
    struct vk_gemm g = { .ldx = (uint32_t)ldx, .ldy = (uint32_t)ldy, .row_off = (uint32_t)w->row_off,
                         .n_out = (uint32_t)w->n_out, .n_in = (uint32_t)w->n_in, .out_bf16 = out == DSV4_OUT_BF16,
                         .max_rows = (uint32_t)n_tok };
    if (!P) dsv4_vk_fault(v, "linear: a %s weight that prepare_weights did not upload", dsv4_wfmt_name(w->fmt));
    else if (act == DSV4_ACT_FP8 && qn > be->scratch_len)
        dsv4_vk_fault(v, "linear: %d rows of %d need %zu floats of scratch, the context has %zu", n_tok, w->n_in, qn,
                      be->scratch_len);
    else if (dsv4_vk_meta_room(v, 64) && one_group(v, P, n_tok, &g)) {
        g.x = dsv4_vk_addr(v, x, xb);
        g.y = dsv4_vk_addr(v, y, yb);
        if (act == DSV4_ACT_FP8 && g.x) {
            VkDeviceAddress q = dsv4_vk_addr(v, be->scratch, qn * 4);
            if (dsv4_vk_act_quant(v, g.x, (uint32_t)ldx, q, (uint32_t)w->n_in, (uint32_t)n_tok, (uint32_t)w->n_in))
                g.x = q, g.ldx = (uint32_t)w->n_in;
            else g.x = 0;
        }
        dsv4_vk_gemm(v, &g, 1);
    }
    pthread_mutex_unlock(&v->mu);
}
