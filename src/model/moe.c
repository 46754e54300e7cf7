/*
 * moe.c - the MoE sublayer (docs/MODEL.md §R3.8-3.9): route every row, run each used expert
 * once over all rows routed to it (so its weights are read once per step), add the shared
 * expert, round the f32 sum to bf16.
 *
 * Accumulation order is fixed: routed experts by ascending expert id, then the shared
 * expert, as the demo's loop does (the moe_combine op's contract); a row's result does not
 * depend on the other rows.
 */
#include "dist/ep.h"
#include "model/runtime.h"

void dsv4_moe_sublayer(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    bool dspark = c->arch == DSV4_ARCH_V4_1 && L->kind.mtp; /* DSpark stages have their own experts */
    int  d = c->d_model, k = dspark ? c->v41.dspark_n_exp_used : c->n_exp_used;
    int  n_exp = dspark ? c->v41.dspark_n_exp : c->n_exp;
    bool hash = L->kind.hash_routed;
    be->ops->router(be, R, S->u, &L->gate, hash ? NULL : L->gate_bias, hash ? L->tid2eid : NULL, S->tok, n_exp, k,
                    c->route_scale, c->arch == DSV4_ARCH_V4_1 ? c->v41.gate_temp : 1.0, S->ids, S->rw, S->router_scratch);
    if (S->dump.fn)
        for (int s = 0; s < S->n_seqs; s++)
            for (int t = 0; t < S->seq_n[s]; t++) {
                /* read back: the routing is backend memory */
                int   r = S->seq_row0[s] + t, ids[64], kk = k < 64 ? k : 64;
                float fid[64], w[64];
                dsv4_dump_read(S, ids, S->ids + (size_t)r * (size_t)k, sizeof(int) * (size_t)kk);
                dsv4_dump_read(S, w, S->rw + (size_t)r * (size_t)k, sizeof(float) * (size_t)kk);
                for (int i = 0; i < kk; i++) fid[i] = (float)ids[i];
                dsv4_dump(S, "router_ids", L->il, s, S->seq_pos0[s] + t, 1, kk, fid);
                dsv4_dump(S, "router_w", L->il, s, S->seq_pos0[s] + t, 1, kk, w);
            }
    /* the group table stays on the backend: `experts` reads the count, the host never does */
    be->ops->moe_dispatch(be, R, k, n_exp, S->ids, S->rw, S->u, d, S->xe, S->row_w, S->pair_of, S->grp);
    if (m->ep) /* expert parallelism (src/dist/ep.h): the other ranks' experts run meanwhile */
        dsv4_ep_experts_begin(m->ep, be, L, L->kind.mtp ? c->n_layer : L->il, R, S->u, S->ids, S->rw, S->grp, S->xe,
                              S->row_w, S->ye, S->exp_scratch);
    else
        be->ops->experts(be, L->experts, n_exp, R * k, S->grp, S->xe, S->row_w, c->swiglu_limit, S->ye,
                         S->exp_scratch);
    be->ops->expert(be, &L->shared, R, S->u, d, NULL, m->shared_limit, S->shared_y, S->exp_scratch);
    if (m->ep) dsv4_ep_experts_end(m->ep, S->ye);
    be->ops->moe_combine(be, R, k, d, S->pair_of, S->ye, S->shared_y, S->f);
}
