/*
 * rank_plan.c - memory per rank of expert parallelism (rank_plan.h): which rank holds each
 * tensor, and the KV and scratch each allocates, sized by the same plans a session and the
 * scheduler use (kv_pool.c, step.c), so the figures follow the code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_pool.h"
#include "model/rank_plan.h"
#include "model/runtime.h"

int dsv4_tensor_expert(const char *name)
{
    const char *p = strstr(name, ".ffn.experts.");
    if (!p) return -1;
    p += strlen(".ffn.experts.");
    char *end;
    long  e = strtol(p, &end, 10);
    return end != p && *end == '.' && e >= 0 && e < (1L << 30) ? (int)e : -1;
}

int dsv4_rank_params_check(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_err *err)
{
    if (p->n_ranks < 1 || p->n_ranks > c->n_exp)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "--ranks %d outside [1, %d]: each rank owns a share of the %d routed experts of a layer",
                            p->n_ranks, c->n_exp, c->n_exp);
    if (p->ctx < 1 || p->ctx > c->max_ctx)
        return dsv4_err_set(err, DSV4_EINVAL, "--ctx %d outside [1, %d] (max_position_embeddings)", p->ctx,
                            c->max_ctx);
    if (p->seqs < 1 || p->step_tokens < p->seqs)
        return dsv4_err_set(err, DSV4_EINVAL, "--step-tokens %d must be at least --seqs %d (one row per sequence)",
                            p->step_tokens, p->seqs);
    return DSV4_OK;
}

void dsv4_rank_mem_init(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_rank_mem *mem)
{
    for (int r = 0; r < p->n_ranks; r++) {
        memset(&mem[r], 0, sizeof(mem[r]));
        dsv4_rank_experts(r, p->n_ranks, c->n_exp, &mem[r].e0, &mem[r].e1);
    }
}

/* The rank that holds a tensor: the owner of its expert, rank 0 for every other. */
static int rank_of(const struct dsv4_config *c, const struct dsv4_rank_params *p, const char *name)
{
    int e = dsv4_tensor_expert(name);
    if (e < 0 || e >= c->n_exp) return 0;
    /* the largest r with floor(r*E/N) <= e, i.e. r*E < (e+1)*N */
    return (int)(((int64_t)(e + 1) * p->n_ranks - 1) / c->n_exp);
}

void dsv4_rank_add_tensor(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_rank_mem *mem,
                          const char *name, uint64_t nbytes)
{
    struct dsv4_rank_mem *m = &mem[rank_of(c, p, name)];
    m->weights += nbytes;
    if (dsv4_tensor_expert(name) >= 0) m->experts += nbytes;
}

struct repack_walk {
    const struct dsv4_config       *c;
    const struct dsv4_rank_params  *p;
    struct dsv4_rank_mem           *mem;
    const struct dsv4_checkpoint   *ck;
    const struct dsv4_backend_kind *kind;
};

static uint64_t a64(uint64_t v)
{
    return (v + 63) & ~(uint64_t)63;
}

/* What prepare_weights does with one projection (cpu_backend.c): tiles of the size
 * export_prepared gives, 64-byte aligned, unless the checkpoint stores them; the weight and
 * scale tensors they stand for are no longer read (paged out after packing). */
static void repack_one(struct dsv4_linear *l, void *ud)
{
    struct repack_walk *W = ud;
    size_t              parts[2];
    if (!l->wt || !W->kind->export_prepared(l, parts, NULL)) return;
    char name[300];
    snprintf(name, sizeof(name), "%s.%s", l->wt->name, W->kind->prepared_suffix);
    if (dsv4_checkpoint_find(W->ck, name)) return; /* stored tiles: mapped, counted with the weights */
    int64_t tiles = (int64_t)(a64(parts[0]) + a64(parts[1]));
    int64_t gone  = (int64_t)l->wt->nbytes + (l->st ? (int64_t)l->st->nbytes : 0);
    W->mem[rank_of(W->c, W->p, l->wt->name)].repack += tiles - gone;
}

void dsv4_rank_add_repack(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_rank_mem *mem,
                          struct dsv4_weights *w, const struct dsv4_checkpoint *ck,
                          const struct dsv4_backend_kind *kind, void *impl)
{
    struct dsv4_backend_settings s;
    memset(&s, 0, sizeof(s));
    kind->settings(impl, &s);
    if (!s.tiles || !kind->export_prepared || !kind->prepared_suffix) return;
    struct repack_walk W = { c, p, mem, ck, kind };
    dsv4_weights_each_linear(w, c, repack_one, &W);
}

int dsv4_rank_plan_finish(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_rank_mem *mem,
                          const struct dsv4_backend_kind *kind, void *impl, struct dsv4_rank_mem *single,
                          struct dsv4_err *err)
{
    /* a model of this config on the backend, without weights: what the plans size by */
    struct dsv4_model *m = calloc(1, sizeof(*m));
    if (!m) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    m->cfg          = *c;
    m->row_fmt      = DSV4_ROW_FP8; /* the current revision's */
    m->backend      = kind;
    m->backend_impl = impl;
    int                        pps = (p->ctx + DSV4_KV_PAGE_TOKENS - 1) / DSV4_KV_PAGE_TOKENS;
    struct dsv4_kv_pool_params kp  = { p->ctx, p->seqs, DSV4_KV_PAGE_TOKENS, p->seqs * pps, 4 * p->seqs, false };
    struct dsv4_kv_plan        kv;
    int                        rc = dsv4_kv_pool_plan(&c->kv, m->row_fmt, &kp, &kv, err);
    if (rc == DSV4_OK) {
        uint64_t step0  = dsv4_step_bytes(m, p->step_tokens, p->ctx) +
                          sizeof(float) * (uint64_t)c->vocab_size * (uint64_t)p->seqs;
        uint64_t expert = dsv4_step_expert_bytes(m, p->step_tokens);
        memset(single, 0, sizeof(*single));
        single->e1 = c->n_exp;
        for (int r = 0; r < p->n_ranks; r++) {
            mem[r].kv      = r == 0 ? kv.total : 0;
            mem[r].scratch = r == 0 ? step0 : expert;
            mem[r].total   = (uint64_t)((int64_t)(mem[r].weights + mem[r].kv + mem[r].scratch) + mem[r].repack);
            single->weights += mem[r].weights;
            single->experts += mem[r].experts;
            single->repack += mem[r].repack;
        }
        single->kv      = kv.total;
        single->scratch = step0;
        single->total   = (uint64_t)((int64_t)(single->weights + single->kv + single->scratch) + single->repack);
    }
    free(m);
    return rc;
}
