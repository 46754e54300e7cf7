/*
 * ref_moe.c - scalar reference of the router and of one SwiGLU expert.
 *
 * The router works in f32 (the demo upcasts both x and the gate weight): score =
 * sqrt(softplus(logit)) with torch's softplus threshold (x > 20 gives x). The bias of
 * score-routed layers only shifts the selection; weights come from the unbiased scores,
 * renormalised over the chosen experts and multiplied by the route scale. Selection is
 * deterministic: equal values go to the lower expert index.
 *
 * The expert follows the demo's Expert.forward: gate and up projections with bf16 outputs
 * promoted to f32, the clamp (up clamped both ways, gate from above only), SiLU, the routing
 * weight applied before the down projection, and bf16 rounding of its input.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/ref.h"
#include "backend/cpu/ref_num.h"

static double softplus(double x)
{
    return x > 20.0 ? x : log1p(exp(x));
}

void dsv4_ref_router(struct dsv4_backend *be, int n, const float *x, const struct dsv4_linear *gate,
                     const float *bias, const int64_t *tid2eid, const int *tokens, int n_exp, int n_used,
                     double route_scale, double gate_temp, int *ids, float *weights, float *scratch)
{
    float *sel    = scratch;                     /* [n_exp] */
    float *logits = scratch + n_exp;             /* [n, n_exp]: every row's gate logits in one pass */
    be->ops->linear(be, gate, n, x, gate->n_in, logits, n_exp, DSV4_ACT_NONE, DSV4_OUT_F32);
    for (int r = 0; r < n; r++) {
        float *score = logits + (size_t)r * (size_t)n_exp;
        for (int e = 0; e < n_exp; e++) {
            float logit = gate_temp == 1.0 ? score[e] : (float)((double)score[e] / (double)(float)gate_temp);
            score[e]    = (float)sqrt(rf32(softplus(logit)));
            sel[e]   = bias ? score[e] + bias[e] : score[e];
        }
        int *ri = ids + (size_t)r * (size_t)n_used;
        if (tid2eid) {
            for (int k = 0; k < n_used; k++) ri[k] = (int)tid2eid[(size_t)tokens[r] * (size_t)n_used + (size_t)k];
        } else {
            for (int k = 0; k < n_used; k++) {
                int best = -1;
                for (int e = 0; e < n_exp; e++) {
                    if (sel[e] == -INFINITY) continue; /* taken */
                    if (best < 0 || sel[e] > sel[best]) best = e;
                }
                ri[k]     = best;
                sel[best] = -INFINITY;
            }
        }
        float *rw  = weights + (size_t)r * (size_t)n_used;
        double sum = 0;
        for (int k = 0; k < n_used; k++) sum += score[ri[k]];
        float fsum = (float)sum;
        for (int k = 0; k < n_used; k++) rw[k] = (float)((double)score[ri[k]] / fsum);
        for (int k = 0; k < n_used; k++) rw[k] = (float)((double)rw[k] * route_scale);
    }
}

void dsv4_ref_expert(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                     const float *row_w, double limit, float *y, float *scratch)
{
    int           f   = e->w1.n_out;
    float        *g   = scratch;                            /* [n, f] */
    float        *v   = scratch + (size_t)n * (size_t)f;    /* [n, f] */
    enum dsv4_act act = (e->w1.fmt == DSV4_WFMT_FP8 || e->w1.fmt == DSV4_WFMT_FP4) ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    be->ops->linear(be, &e->w1, n, x, ldx, g, f, act, DSV4_OUT_BF16);
    be->ops->linear(be, &e->w3, n, x, ldx, v, f, act, DSV4_OUT_BF16);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < f; i++) {
            size_t k  = (size_t)r * (size_t)f + (size_t)i;
            double gg = g[k], vv = v[k];
            if (limit > 0) {
                vv = fmin(fmax(vv, -limit), limit);
                gg = fmin(gg, limit);
            }
            double h = rf32(rf32(gg * (1.0 / (1.0 + exp(-gg)))) * vv); /* silu(gate) * up, f32 */
            if (row_w) h = rf32((double)row_w[r] * h);
            g[k] = rbf16(h);
        }
    be->ops->linear(be, &e->w2, n, g, f, y, e->w2.n_out, act, DSV4_OUT_BF16);
}

void dsv4_ref_experts(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_exp, int n_pairs,
                      const int *grp, const float *x, const float *row_w, double limit, float *y, float *scratch)
{
    /* the count is read here, from the dispatch's table: the host never sees it */
    int        n_groups = grp[0];
    const int *ids = grp + 1, *off = grp + 1 + n_exp;
    DSV4_ASSERT(n_groups >= 0 && n_groups <= n_exp && off[n_groups] <= n_pairs);
    if (n_groups < 1) return;
    int d = experts[ids[0]].w2.n_out; /* the groups' experts (all of one width) */
    for (int g = 0; g < n_groups; g++)
        be->ops->expert(be, &experts[ids[g]], off[g + 1] - off[g], x + (size_t)off[g] * (size_t)d, d, row_w + off[g],
                        limit, y + (size_t)off[g] * (size_t)d, scratch);
}
