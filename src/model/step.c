/*
 * step.c - the scratch of one forward step, planned once and carved from one allocation
 * (llm.c's malloc-and-point). Sizes follow from the config, the largest batch of rows and
 * the largest context; nothing in the forward allocates afterwards.
 */
#include <stdlib.h>
#include <string.h>

#include "model/runtime.h"

static size_t a64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

static int imax(int a, int b)
{
    return a > b ? a : b;
}

/* Largest number of cached rows one query attends to. */
static int max_attn_rows(const struct dsv4_config *c, int max_ctx)
{
    int most = 0;
    for (int il = 0; il < c->n_layer; il++) {
        int r = c->ratio[il];
        if (r == 4) most = imax(most, imax(0, c->idx_topk < max_ctx / 4 ? c->idx_topk : max_ctx / 4));
        else if (r) most = imax(most, max_ctx / r);
    }
    return c->window + most;
}

static size_t plan(struct dsv4_step *s, const struct dsv4_model *m, int R, int max_ctx, uint8_t *base)
{
    const struct dsv4_config *c = &m->cfg;
    size_t off = 0;
    size_t d = (size_t)c->d_model, hc = (size_t)c->hc, r = (size_t)R;
    int    attn_rows = max_attn_rows(c, max_ctx);
#define F(ptr, n)                                                                                                  \
    do {                                                                                                           \
        if (base) (ptr) = (void *)(base + off);                                                                    \
        off += a64(sizeof(float) * (size_t)(n));                                                                   \
    } while (0)
#define B(ptr, n)                                                                                                  \
    do {                                                                                                           \
        if (base) (ptr) = (void *)(base + off);                                                                    \
        off += a64((size_t)(n));                                                                                   \
    } while (0)
    F(s->X, r * hc * d);
    F(s->Xn, r * hc * d);
    F(s->Xm, r * hc * d);
    F(s->u, r * d);
    F(s->f, r * d);
    F(s->post, r * hc);
    F(s->comb, r * hc * hc);
    F(s->qr, r * (size_t)c->q_lora_rank);
    F(s->q, r * (size_t)c->n_head * (size_t)c->d_head);
    F(s->o, r * (size_t)c->n_head * (size_t)c->d_head);
    F(s->kv, r * (size_t)c->d_head);
    F(s->z, r * (size_t)c->o_groups * (size_t)c->o_lora_rank);
    F(s->ca, r * 2 * (size_t)c->d_head);
    F(s->cg, r * 2 * (size_t)c->d_head);
    F(s->crow, (size_t)c->d_head);
    F(s->qi, r * (size_t)c->n_idx_head * (size_t)c->d_idx_head);
    F(s->wi, r * (size_t)c->n_idx_head);
    F(s->iscore, (size_t)(max_ctx / 4 + 1));
    F(s->isel, (size_t)(max_ctx / 4 + 1));
    B(s->kblk, sizeof(void *) * (size_t)(max_ctx / 4 + 1));
    F(s->moe_y, 2 * r * d);
    size_t pairs = r * (size_t)c->n_exp_used;
    F(s->xe, pairs * d);
    F(s->ye, pairs * d);
    F(s->row_w, pairs);
    F(s->rows_e, pairs);
    F(s->grp_ids, (size_t)c->n_exp + 1);
    F(s->grp_off, (size_t)c->n_exp + 1);
    F(s->exp_scratch, 2 * (pairs > r ? pairs : r) * (size_t)c->d_ff_exp);
    F(s->router_scratch, (r + 1) * (size_t)c->n_exp);
    F(s->ids, r * (size_t)c->n_exp_used);
    F(s->rw, r * (size_t)c->n_exp_used);
    F(s->hid, r * d);
    F(s->pos, r);
    F(s->tok, r);
    F(s->seq_row0, r);
    F(s->seq_n, r);
    F(s->seq_pos0, r);
    B(s->rowptr, sizeof(void *) * (size_t)attn_rows);
    B(s->staging, r * (size_t)dsv4_row_bytes(m->row_fmt, c->d_head, c->d_rope));
    size_t lin = (size_t)imax(imax(c->d_model, c->q_lora_rank), imax(c->n_head * c->d_head / c->o_groups,
                                                                   imax(c->o_groups * c->o_lora_rank, c->d_ff_exp)));
    size_t sc  = lin + lin / 128 + 2;
    size_t att = (size_t)c->n_head * (size_t)attn_rows + (size_t)c->d_head;
    if (att > sc) sc = att;
    if ((size_t)c->d_idx_head > sc) sc = (size_t)c->d_idx_head;
    size_t fast = m->backend ? m->backend->scratch_floats(m->backend_impl, c, R, attn_rows) : 0;
    if (fast > sc) sc = fast;
    F(s->be.scratch, sc);
    if (base) {
        s->be.scratch_len   = sc;
        s->max_attn_rows    = attn_rows;
    }
#undef F
#undef B
    return off;
}

size_t dsv4_step_bytes(const struct dsv4_model *m, int max_rows, int max_ctx)
{
    struct dsv4_step tmp;
    memset(&tmp, 0, sizeof(tmp));
    return plan(&tmp, m, max_rows, max_ctx, NULL);
}

int dsv4_step_init(struct dsv4_step *s, const struct dsv4_model *m, int max_rows, int max_ctx, struct dsv4_err *err)
{
    memset(s, 0, sizeof(*s));
    size_t bytes = plan(s, m, max_rows, max_ctx, NULL);
    void  *mem   = NULL;
    if (posix_memalign(&mem, 64, bytes) != 0 || !mem)
        return dsv4_err_set(err, DSV4_ENOMEM, "cannot allocate %.1f MiB of step scratch for %d rows",
                            (double)bytes / 1048576.0, max_rows);
    memset(mem, 0, bytes);
    plan(s, m, max_rows, max_ctx, mem);
    s->mem       = mem;
    s->mem_bytes = bytes;
    s->max_rows  = max_rows;
    s->max_ctx   = max_ctx;
    s->be.ops    = m->ops;
    s->be.impl   = m->backend_impl;
    s->be.prof   = m->prof;
    return DSV4_OK;
}

void dsv4_step_free(struct dsv4_step *s)
{
    free(s->mem);
    memset(s, 0, sizeof(*s));
}
