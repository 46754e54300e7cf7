/*
 * moe.c - the MoE sublayer (docs/MODEL.md §R3.8-3.9): route every row, run each used expert
 * once over all rows routed to it (so its weights are read once per step), add the shared
 * expert, round the f32 sum to bf16.
 *
 * Accumulation order is fixed: routed experts by ascending expert id, then the shared
 * expert, as the demo's loop does; the sum is in double (bf16 terms, so exact) and a row's
 * result does not depend on the other rows.
 */
#include <string.h>

#include "model/runtime.h"

void dsv4_moe_sublayer(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int d = c->d_model, k = c->n_exp_used;
    bool hash = !L->is_mtp && L->il < c->n_hash_layer;
    be->ops->router(be, R, S->u, &L->gate, hash ? NULL : L->gate_bias, hash ? L->tid2eid : NULL, S->tok, c->n_exp, k,
                    c->route_scale, S->ids, S->rw, S->router_scratch);
    if (S->dump.fn)
        for (int s = 0; s < S->n_seqs; s++)
            for (int t = 0; t < S->seq_n[s]; t++) {
                int   r = S->seq_row0[s] + t;
                float fid[64];
                for (int i = 0; i < k && i < 64; i++) fid[i] = (float)S->ids[r * k + i];
                dsv4_dump(S, "router_ids", L->il, s, S->seq_pos0[s] + t, 1, k, fid);
                dsv4_dump(S, "router_w", L->il, s, S->seq_pos0[s] + t, 1, k, S->rw + (size_t)r * (size_t)k);
            }
    /* gather (row, weight) pairs expert by expert, ascending expert id */
    int n_groups = 0, np = 0;
    for (int e = 0; e < c->n_exp; e++) {
        int start = np;
        for (int r = 0; r < R; r++)
            for (int i = 0; i < k; i++)
                if (S->ids[r * k + i] == e) {
                    S->rows_e[np] = r;
                    S->row_w[np]  = S->rw[r * k + i];
                    memcpy(S->xe + (size_t)np * (size_t)d, S->u + (size_t)r * (size_t)d, sizeof(float) * (size_t)d);
                    np++;
                }
        if (np == start) continue;
        S->grp_ids[n_groups] = e;
        S->grp_off[n_groups] = start;
        n_groups++;
    }
    S->grp_off[n_groups] = np;
    memset(S->moe_y, 0, sizeof(double) * (size_t)R * (size_t)d);
    if (n_groups)
        be->ops->experts(be, L->experts, n_groups, S->grp_ids, S->grp_off, S->xe, S->row_w, c->swiglu_limit, S->ye,
                         S->exp_scratch);
    for (int i = 0; i < np; i++) {
        double      *y  = S->moe_y + (size_t)S->rows_e[i] * (size_t)d;
        const float *ye = S->ye + (size_t)i * (size_t)d;
        for (int j = 0; j < d; j++) y[j] += ye[j];
    }
    be->ops->expert(be, &L->shared, R, S->u, d, NULL, m->shared_limit, S->ye, S->exp_scratch);
    for (size_t i = 0; i < (size_t)R * (size_t)d; i++) S->f[i] = dsv4_round_bf16((float)(S->moe_y[i] + S->ye[i]));
}
