/*
 * ep.h - expert parallelism over MPI (issue 20; docs/DISTRIBUTED.md; internal).
 *
 * Layout (dsv4_rank_experts, model/rank_plan.h, shared with `dsv4 inspect --ranks`). Rank r
 * of N holds the routed experts [floor(r E / N), floor((r + 1) E / N)) of
 * every MoE layer, the MTP block's included (E = n_routed_experts). Rank 0 also holds the
 * trunk, every other weight (embedding, attention, compressors, indexer, mHC, router, shared
 * expert, head), the KV cache, the tokenizer, the scheduler and the HTTP server: it runs the
 * whole forward. The other ranks are expert servers: each maps the checkpoint but prepares
 * and touches only its experts' bytes, and runs one loop (dsv4_mpi_serve) that waits for
 * rank 0's commands.
 *
 * A MoE layer on rank 0 (moe.c): route and dispatch as in one process (the pairs grouped by
 * ascending expert id, so each rank's groups are one contiguous range of pairs), then
 * dsv4_ep_experts_begin sends every rank its part and runs rank 0's own experts; the shared
 * expert runs; dsv4_ep_experts_end gathers the other ranks' outputs into their places in ye;
 * the combine sums in the fixed order of one process. Each expert runs on exactly the rows
 * it runs on in one process, in the same order, with the same kernels: the logits are the
 * same bits at any N (tests/unit/test_mpi.c).
 *
 * Dispatch (params.ep_dispatch): ROWS scatters to each rank the rows routed to its experts
 * (about R k / N rows of d floats each); TOKENS broadcasts the layer's R token rows and the
 * routing (R k ids and weights) and each rank dispatches for itself: fewer bytes when
 * N < k (batch 1 decode), more for large steps. The results come back as rows either way.
 *
 * Messages (all from rank 0, MPI_COMM_WORLD, blocking collectives, one thread at a time):
 * a command header (Bcast), then the command's payload. OPEN carries the checkpoint directory
 * and the engine's options; every rank answers with its status (Gather). CLOSE frees the
 * model; QUIT ends dsv4_mpi_serve. A rank that dies ends the job through mpirun (no rank
 * waits forever on a dead peer: Open MPI aborts the others).
 */
#ifndef DSV4_EP_H
#define DSV4_EP_H

#include <stdbool.h>

#include "dsv4.h"

struct dsv4_model;
struct dsv4_ep;
struct dsv4_logger;
struct dsv4_backend;
struct dsv4_layer_w;

/* The ranks an engine opened with params is spread over (1 = this process alone), or a
 * status with err set when params.ep does not match mpirun's ranks or this build. */
int  dsv4_ep_ranks_for(const struct dsv4_engine_params *params, int *ranks, struct dsv4_err *err);
/* Rank 0, ranks > 1: sends OPEN (dir and the engine's options) so the other ranks load their
 * parts while rank 0 loads its own. Every exchange with the ranks holds one process-wide lock
 * (here until dsv4_ep_attach; in a MoE layer from _begin to _end): two threads stepping two
 * sessions take turns, as MPI_THREAD_SERIALIZED asks. */
int  dsv4_ep_announce(const char *dir, const struct dsv4_engine_params *params, int ranks, struct dsv4_err *err);
/* Rank 0, after its own load (own_rc, own: its result): gathers every rank's result; on
 * success sets m->ep, else has the ranks that loaded free their parts and returns the first
 * failure (a rank's message names the rank). */
int  dsv4_ep_attach(struct dsv4_model *m, int ranks, enum dsv4_ep_dispatch how, int own_rc,
                    const struct dsv4_err *own, const struct dsv4_logger *lg, struct dsv4_err *err);
/* Has the other ranks free their parts (logging what went through MPI); m->ep NULL is a
 * no-op. */
void dsv4_ep_detach(struct dsv4_model *m, const struct dsv4_logger *lg);
/* Has every rank size its buffers for steps of up to rows rows (a step plan being made on
 * rank 0, dsv4_step_init): nothing is allocated later, during the steps. */
int  dsv4_ep_reserve(struct dsv4_ep *ep, int rows, struct dsv4_err *err);

/* A MoE layer's routed experts across the ranks (see above). li: the layer (n_layer for the
 * MTP block). R rows of u[R, d] were routed to ids/rw[R, k] and dispatched into xe, row_w,
 * grp (backend.h: moe_dispatch); ye gets every pair's output once _end returns. */
void dsv4_ep_experts_begin(struct dsv4_ep *ep, struct dsv4_backend *be, const struct dsv4_layer_w *L, int li, int R,
                           const float *u, const int *ids, const float *rw, const int *grp, const float *xe,
                           const float *row_w, float *ye, float *scratch);
void dsv4_ep_experts_end(struct dsv4_ep *ep, float *ye);

void dsv4_ep_stats_of(const struct dsv4_ep *ep, struct dsv4_ep_stats *st);

/* Every rank's read bandwidth over a buffer of bytes (best of reps), measured at the same
 * time, into gbps[ranks] (-1 where it could not be measured); returns the ranks (1 alone). */
int dsv4_ep_bandwidth(const struct dsv4_model *m, size_t bytes, int reps, double *gbps);

#endif
