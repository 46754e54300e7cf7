/*
 * rank_plan.h - memory per rank of expert parallelism (docs/DISTRIBUTED.md "Memory per
 * rank"), for `dsv4 inspect --ranks N`.
 *
 * The layout: rank r of N owns the routed experts [floor(r*E/N), floor((r+1)*E/N)) of every
 * MoE layer, the MTP block's included (E = n_routed_experts). Rank 0 also holds every other
 * weight, the whole KV cache (pool pages for ctx x seqs, slots, prefix snapshots) and the
 * step's scratch; ranks 1..N-1 hold their experts, the rows routed to them in a step (up to
 * step_tokens * k rows of d_model floats in and out) and the experts op's scratch.
 */
#ifndef DSV4_RANK_PLAN_H
#define DSV4_RANK_PLAN_H

#include "model/model.h"

struct dsv4_rank_params {
    int n_ranks;
    int ctx;         /* positions per sequence */
    int seqs;        /* concurrent sequences (KV slots and pages for ctx each) */
    int step_tokens; /* token rows per step (the scheduler's max_batch_tokens) */
};

struct dsv4_rank_mem {
    int      e0, e1;  /* routed experts [e0, e1) of each MoE layer */
    uint64_t weights; /* stored bytes of the tensors it holds, as mapped */
    uint64_t experts; /* of which routed experts */
    int64_t  repack;  /* load-time copies of the CPU level (tiles) less the mapped bytes they replace */
    uint64_t kv;      /* KV pool: slots, pages, prefix snapshots, tables */
    uint64_t scratch; /* step scratch and logits (rank 0); routed rows in and out and the experts op's scratch */
    uint64_t total;   /* weights + repack + kv + scratch */
};

/* The routed experts [*e0, *e1) rank r of n owns, of n_exp. */
static inline void dsv4_rank_experts(int r, int n, int n_exp, int *e0, int *e1)
{
    *e0 = (int)((int64_t)r * n_exp / n);
    *e1 = (int)((int64_t)(r + 1) * n_exp / n);
}

/* The routed expert a tensor belongs to ("...ffn.experts.E.", stored tiles included), or -1. */
int dsv4_tensor_expert(const char *name);

/* DSV4_EINVAL, naming the value, unless 1 <= n_ranks <= n_routed_experts (every rank owns an
 * expert), ctx in [1, max_position_embeddings], seqs >= 1, step_tokens >= seqs. */
int dsv4_rank_params_check(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_err *err);

/* Sets each rank's expert range and zeroes its sizes: mem[n_ranks]. */
void dsv4_rank_mem_init(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_rank_mem *mem);

/* Adds a tensor's bytes to the rank that holds it. */
void dsv4_rank_add_tensor(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_rank_mem *mem,
                          const char *name, uint64_t nbytes);

/* Adds the tiles the backend instance (kind, impl) makes at load, per rank, when it repacks
 * (settings.tiles): each bound projection of w that it would hold in its own layout and whose
 * tiles the checkpoint ck does not store. */
void dsv4_rank_add_repack(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_rank_mem *mem,
                          struct dsv4_weights *w, const struct dsv4_checkpoint *ck,
                          const struct dsv4_backend_kind *kind, void *impl);

/* Fills kv, scratch and total of every rank, the scratch sized for the backend instance
 * (kind, impl), as a session of it would plan: the KV pool's plan (kv_pool.c, default page
 * size and prefix entries of the scheduler) and the step's (step.c). single: the same for
 * one process holding everything. */
int dsv4_rank_plan_finish(const struct dsv4_config *c, const struct dsv4_rank_params *p, struct dsv4_rank_mem *mem,
                          const struct dsv4_backend_kind *kind, void *impl, struct dsv4_rank_mem *single,
                          struct dsv4_err *err);

#endif
