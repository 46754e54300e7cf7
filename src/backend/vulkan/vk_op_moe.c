/*
 * vk_op_moe.c - the MoE ops on the device: router (the gate through linear, then
 * shaders/router.comp), expert and experts (gate and up through the grouped projection,
 * swiglu.comp, the down projection: the same three dispatches for one expert or for every
 * group of a step's table), moe_dispatch (moe_dispatch.comp, moe_gather.comp) and
 * moe_combine (moe_combine.comp).
 *
 * `experts` never reads the group count on the host: each projection's grid has a row of
 * workgroups per possible group (n_exp) and those past grp[0] exit at once; each group's
 * weight comes from the layer's table of descriptor pointers (vk_weights.c), so one dispatch
 * covers all the experts of the step. Inputs that may be host metadata or backend memory
 * (token ids, a test's tables) are taken either way (in_addr).
 */
#include <string.h>

#include "backend/vulkan/vk.h"

/* The device address of an input: p itself when it is backend memory, else a copy of its
 * bytes in the metadata area. 0 (and a fault) on failure. */
static VkDeviceAddress in_addr(struct dsv4_vk *v, const void *p, size_t bytes)
{
    if (!p) return 0;
    if (dsv4_vk_owns(v, p)) return dsv4_vk_addr(v, p, bytes);
    struct vk_bind  b;
    VkDeviceAddress a = 0;
    void           *m = dsv4_vk_meta(v, bytes, &b, &a);
    if (m) memcpy(m, p, bytes);
    return m ? a : 0;
}

void dsv4_vk_router(struct dsv4_backend *be, int n, const float *x, const struct dsv4_linear *gate,
                    const float *bias, const int64_t *tid2eid, const int *tokens, int n_exp, int n_used,
                    double route_scale, double gate_temp, int *ids, float *weights, float *scratch)
{
    struct dsv4_vk *v = be->impl;
    if (n <= 0) return;
    float *logits = scratch + n_exp; /* the reference's layout: [n_exp] then [n, n_exp] */
    dsv4_vk_linear(be, gate, n, x, gate->n_in, logits, n_exp, DSV4_ACT_NONE, DSV4_OUT_F32);
    pthread_mutex_lock(&v->mu);
    size_t np = (size_t)n * (size_t)n_used;
    dsv4_vk_meta_room(v, (size_t)n * sizeof(int) + 256);
    struct {
        double          route_scale, gate_temp;
        VkDeviceAddress logits, bias, tid2eid, tokens, ids, weights;
        uint32_t        n, n_exp, n_used;
    } pc = { route_scale, (double)(float)gate_temp,
             dsv4_vk_addr(v, logits, (size_t)n * (size_t)n_exp * 4),
             bias ? dsv4_vk_addr(v, bias, (size_t)n_exp * 4) : 0,
             tid2eid ? dsv4_vk_addr(v, tid2eid, 8) : 0, /* its extent: the vocabulary, not known here */
             tid2eid ? in_addr(v, tokens, (size_t)n * sizeof(int)) : 0,
             dsv4_vk_addr(v, ids, np * sizeof(int)),
             dsv4_vk_addr(v, weights, np * 4),
             (uint32_t)n, (uint32_t)n_exp, (uint32_t)n_used };
    bool ok = pc.logits && pc.ids && pc.weights && (!bias || pc.bias) && (!tid2eid || (pc.tid2eid && pc.tokens));
    if (ok) dsv4_vk_dispatch(v, "router", NULL, 0, &pc, sizeof(pc), dsv4_vk_groups((uint64_t)n, 64), 1, 1);
    pthread_mutex_unlock(&v->mu);
}

/* What the expert ops share: the experts' table and group table, the rows and their
 * weights, the widths. */
struct vk_ffn {
    VkDeviceAddress tab, grp, x, row_w, y, g, u; /* g, u: the caller's scratch [rows, f] each */
    uint32_t        n_exp, rows, ldx, d, f;
    bool            act;   /* FP8 activations (FP8 and FP4 weights) */
    double          limit;
};

static bool swiglu(struct dsv4_vk *v, const struct vk_ffn *F)
{
    struct {
        double          limit;
        VkDeviceAddress g, u, row_w;
        uint32_t        rows, f;
    } pc = { F->limit, F->g, F->u, F->row_w, F->rows, F->f };
    return dsv4_vk_dispatch(v, "swiglu", NULL, 0, &pc, sizeof(pc), dsv4_vk_groups((uint64_t)F->rows * F->f, 256), 1,
                            1);
}

/* gate and up, SwiGLU, down: every group of F's table (no more groups than rows: the grids
 * cover min(n_exp, rows)). Under v->mu. */
static void run_ffn(struct dsv4_backend *be, const struct vk_ffn *F)
{
    struct dsv4_vk *v  = be->impl;
    size_t          qn = (size_t)F->rows * F->d;
    struct vk_gemm  g  = { .tab = F->tab, .grp = F->grp, .x = F->x, .ldx = F->ldx, .n_exp = F->n_exp,
                           .n_out = F->f, .n_in = F->d, .out_bf16 = 1, .ldy = F->f };
    if (F->act) {
        if (qn > be->scratch_len) {
            dsv4_vk_fault(v, "experts: %u rows of %u need %zu floats of scratch, the context has %zu", F->rows, F->d,
                          qn, be->scratch_len);
            return;
        }
        g.x   = dsv4_vk_addr(v, be->scratch, qn * 4);
        g.ldx = F->d;
        if (!dsv4_vk_act_quant(v, F->x, F->ldx, g.x, F->d, F->rows, F->d)) return;
    }
    g.mat = 0, g.y = F->g;
    bool ok = dsv4_vk_gemm(v, &g, F->rows);
    g.mat = 1, g.y = F->u;
    ok = ok && dsv4_vk_gemm(v, &g, F->rows) && swiglu(v, F);
    if (ok && F->act) ok = dsv4_vk_act_quant(v, F->g, F->f, F->g, F->f, F->rows, F->f);
    g   = (struct vk_gemm){ .tab = F->tab, .grp = F->grp, .x = F->g, .ldx = F->f, .n_exp = F->n_exp, .mat = 2,
                            .y = F->y, .ldy = F->d, .n_out = F->d, .n_in = F->f, .out_bf16 = 1 };
    if (ok) dsv4_vk_gemm(v, &g, F->rows);
}

static bool act_of(enum dsv4_wfmt f)
{
    return f == DSV4_WFMT_FP8 || f == DSV4_WFMT_FP4;
}

/* The scratch halves and the output of an FFN over `rows` rows. */
static bool ffn_bufs(struct dsv4_vk *v, struct vk_ffn *F, const float *y, const float *scratch)
{
    size_t half = (size_t)F->rows * F->f;
    F->g = dsv4_vk_addr(v, scratch, 2 * half * 4);
    F->u = F->g ? F->g + half * 4 : 0;
    F->y = dsv4_vk_addr(v, y, (size_t)F->rows * F->d * 4);
    return F->g && F->y;
}

void dsv4_vk_expert(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                    const float *row_w, double limit, float *y, float *scratch)
{
    struct dsv4_vk *v = be->impl;
    if (n <= 0) return;
    pthread_mutex_lock(&v->mu);
    const struct vk_lin_prep *P[3] = { e->w1.prep, e->w3.prep, e->w2.prep };
    struct vk_ffn F = { .n_exp = 1, .rows = (uint32_t)n, .ldx = (uint32_t)ldx, .d = (uint32_t)e->w1.n_in,
                        .f = (uint32_t)e->w1.n_out, .act = act_of(e->w1.fmt), .limit = limit };
    struct vk_bind b;
    int           *grp = dsv4_vk_meta_room(v, 256) ? dsv4_vk_meta(v, 4 * sizeof(int), &b, &F.grp) : NULL;
    uint64_t      *tab = grp ? dsv4_vk_meta(v, 3 * sizeof(uint64_t), &b, &F.tab) : NULL;
    if (!P[0] || !P[1] || !P[2]) dsv4_vk_fault(v, "expert: weights that prepare_weights did not upload");
    else if (tab) {
        grp[0] = 1, grp[1] = 0, grp[2] = 0, grp[3] = n;
        for (int i = 0; i < 3; i++) tab[i] = dsv4_vk_addr(v, P[i]->desc_at, sizeof(P[i]->d));
        F.x     = dsv4_vk_addr(v, x, ((size_t)(n - 1) * (size_t)ldx + F.d) * 4);
        F.row_w = row_w ? dsv4_vk_addr(v, row_w, (size_t)n * 4) : 0;
        if (tab[0] && tab[1] && tab[2] && F.x && (!row_w || F.row_w) && ffn_bufs(v, &F, y, scratch)) run_ffn(be, &F);
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_experts(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_exp, int n_pairs,
                     const int *grp, const float *x, const float *row_w, double limit, float *y, float *scratch)
{
    struct dsv4_vk *v = be->impl;
    if (n_pairs <= 0 || n_exp <= 0) return;
    int e0 = 0; /* the widths: every expert of a layer has its first's */
    while (e0 < n_exp && !experts[e0].w1.prep) e0++;
    pthread_mutex_lock(&v->mu);
    if (e0 == n_exp) {
        dsv4_vk_fault(v, "experts: no expert was prepared");
    } else {
        const struct dsv4_expert_w *e = &experts[e0];
        struct vk_ffn F = { .n_exp = (uint32_t)n_exp, .rows = (uint32_t)n_pairs, .ldx = (uint32_t)e->w1.n_in,
                            .d = (uint32_t)e->w1.n_in, .f = (uint32_t)e->w1.n_out, .act = act_of(e->w1.fmt),
                            .limit = limit };
        F.tab = dsv4_vk_expert_table(v, experts, n_exp); /* first: it may let the lock go */
        dsv4_vk_meta_room(v, (2 * (size_t)n_exp + 2) * sizeof(int) + 256);
        F.grp   = in_addr(v, grp, (2 * (size_t)n_exp + 2) * sizeof(int));
        F.x     = dsv4_vk_addr(v, x, (size_t)n_pairs * F.d * 4);
        F.row_w = dsv4_vk_addr(v, row_w, (size_t)n_pairs * 4);
        if (F.tab && F.grp && F.x && F.row_w && ffn_bufs(v, &F, y, scratch)) run_ffn(be, &F);
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_moe_dispatch(struct dsv4_backend *be, int n, int k, int n_exp, const int *ids, const float *w,
                          const float *x, int d, float *xe, float *row_w, int *pair_of, int *grp)
{
    struct dsv4_vk *v  = be->impl;
    size_t          np = (size_t)n * (size_t)k;
    if (n_exp < 1 || n_exp > DSV4_MAX_EXPERTS) return;
    pthread_mutex_lock(&v->mu);
    dsv4_vk_meta_room(v, np * 8 + 256);
    struct {
        VkDeviceAddress ids, w, row_w, pair_of, grp;
        uint32_t        n_pairs, n_exp;
    } pc = { in_addr(v, ids, np * sizeof(int)), in_addr(v, w, np * 4), dsv4_vk_addr(v, row_w, np * 4),
             dsv4_vk_addr(v, pair_of, np * sizeof(int)), dsv4_vk_addr(v, grp, (2 * (size_t)n_exp + 2) * sizeof(int)),
             (uint32_t)np, (uint32_t)n_exp };
    struct {
        VkDeviceAddress pair_of, x, xe;
        uint32_t        n_pairs, k, d;
    } gc = { pc.pair_of, dsv4_vk_addr(v, x, (size_t)n * (size_t)d * 4), dsv4_vk_addr(v, xe, np * (size_t)d * 4),
             (uint32_t)np, (uint32_t)k, (uint32_t)d };
    if (pc.ids && pc.w && pc.row_w && pc.pair_of && pc.grp && gc.x && gc.xe &&
        dsv4_vk_fits_u32(v, np * (size_t)d, "moe_dispatch") &&
        dsv4_vk_dispatch(v, "moe_dispatch", NULL, 0, &pc, sizeof(pc), 1, 1, 1) && np * (size_t)d > 0)
        dsv4_vk_dispatch(v, "moe_gather", NULL, 0, &gc, sizeof(gc), dsv4_vk_groups(np * (size_t)d, 256), 1, 1);
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_moe_combine(struct dsv4_backend *be, int n, int k, int d, const int *pair_of, const float *ye,
                         const float *shared, float *f)
{
    struct dsv4_vk *v  = be->impl;
    size_t          nd = (size_t)n * (size_t)d, np = (size_t)n * (size_t)k;
    if (!nd || k < 1 || k > 64) return;
    pthread_mutex_lock(&v->mu);
    dsv4_vk_meta_room(v, np * sizeof(int) + 256);
    struct {
        VkDeviceAddress pair_of, ye, shared, f;
        uint32_t        n, k, d;
    } pc = { in_addr(v, pair_of, np * sizeof(int)), dsv4_vk_addr(v, ye, np * (size_t)d * 4),
             dsv4_vk_addr(v, shared, nd * 4), dsv4_vk_addr(v, f, nd * 4), (uint32_t)n, (uint32_t)k, (uint32_t)d };
    if (pc.pair_of && pc.ye && pc.shared && pc.f && dsv4_vk_fits_u32(v, np * (size_t)d, "moe_combine"))
        dsv4_vk_dispatch(v, "moe_combine", NULL, 0, &pc, sizeof(pc), dsv4_vk_groups(nd, 256), 1, 1);
    pthread_mutex_unlock(&v->mu);
}
