/*
 * runtime.h - what the forward pass needs at run time: the loaded model (config, weights,
 * RoPE tables, backend), the per-step scratch plan, and the description of one forward step
 * over a batch of sequence chunks.
 */
#ifndef DSV4_RUNTIME_H
#define DSV4_RUNTIME_H

#include "backend/backend.h"
#include "backend/prof_xfer.h"
#include "kv/kv.h"
#include "model/model.h"

struct dsv4_model {
    struct dsv4_config             cfg;
    struct dsv4_checkpoint         ck;
    struct dsv4_weights            w;
    struct dsv4_arena              arena;       /* weights' per-layer structs */
    enum dsv4_revision             revision;
    enum dsv4_row_fmt              row_fmt;     /* FP8 compact (current revision) or bf16 */
    double                         shared_limit; /* swiglu clamp of the shared expert */
    /* the host copies the model computes at load; rope_swa/rope_comp.freq may point at the
     * backend's (prepare_weights through each_tensor), the one the rope op is given */
    float                         *freq_swa;    /* [d_rope/2] rope_theta, no YaRN */
    float                         *freq_comp;   /* [d_rope/2] compress_rope_theta with YaRN */
    struct dsv4_rope_table         rope_swa, rope_comp;
    const struct dsv4_backend_kind *backend;    /* created by dsv4_backend_find(params.backend) */
    const struct dsv4_backend_ops *ops;
    void                          *backend_impl;
    struct dsv4_prof              *prof;        /* params.profile_path: ops is then dsv4_prof_ops */
    /* Expert parallelism (src/dist/ep.h): this process holds the routed experts
     * [exp_lo, exp_hi) of every MoE layer, and the trunk (every other weight) when trunk is
     * set; one process holds all. ep: rank 0's link to the other ranks, NULL in one process. */
    int                            exp_lo, exp_hi;
    bool                           trunk;
    int                            ep_ranks;    /* the ranks of the layout (1: one process) */
    enum dsv4_ep_dispatch          ep_dispatch; /* params.ep_dispatch */
    struct dsv4_ep                *ep;
    struct dsv4_v41_model         *v41;         /* DeepSeek-V4.1's load-time tables (model_v41.c), else NULL */
};

/* What a DeepSeek-V4.1 model computes once at load (model_v41.c): the Engram hashing and
 * token map, each Engram layer's gate weights and the zero APE table of its ratio-2
 * compressors (official Compressor without ape). */
struct dsv4_v41_model {
    struct dsv4_engram_hash hash;
    int32_t *map;                                /* [map_n] token id -> compressed id (malloc'd) */
    int64_t  map_n;
    int      n_engram;                           /* Engram layers; ids per row: n_engram * hash.n_cols */
    int      engram_of[DSV4_MAX_LAYERS];         /* layer -> its Engram index, -1 */
    float   *engram_w[DSV4_MAX_ENGRAM_LAYERS];   /* [hc, d_model] f32(q_weight * k_weight) */
    float   *zero_ape;                           /* [2, d_head] zeros */
};

/* model_v41.c: the tables above (arena memory but the map), after binding; frees the map. */
int  dsv4_model_load_v41(struct dsv4_model *m, const char *dir, struct dsv4_err *err);
void dsv4_model_free_v41(struct dsv4_model *m);

/* Loads a checkpoint with the engine's parameters (revision, threads, backend and its
 * options, profile). */
int  dsv4_model_load(struct dsv4_model *m, const char *dir, const struct dsv4_engine_params *params,
                     const struct dsv4_logger *lg, struct dsv4_err *err);
/* The part of the model rank `rank` of `ranks` holds under expert parallelism (ranks 1 = the
 * whole model; src/dist/ep.h has the layout): only its weights are prepared and touched. */
int  dsv4_model_load_part(struct dsv4_model *m, const char *dir, const struct dsv4_engine_params *params,
                          const struct dsv4_logger *lg, int rank, int ranks, struct dsv4_err *err);
void dsv4_model_free(struct dsv4_model *m);
/* Whether m's part holds checkpoint tensor t (all of them in one process). */
bool dsv4_model_holds(const struct dsv4_model *m, const struct dsv4_tensor *t);

/* RoPE frequencies for one base (docs/MODEL.md §R3.3). */
void dsv4_rope_freqs(float *freq, int d_rope, float base, bool yarn, float factor, int orig_len,
                     float beta_fast, float beta_slow);

/* Named intermediate tensors, reported as they are computed (dsv4 align, tests). `il` is
 * the layer (n_layer for the MTP block, -1 for model-level stages), `pos` the position of
 * the first of n rows of `width` floats (compressed rows: the row index). */
struct dsv4_dump_sink {
    void (*fn)(void *ud, const char *stage, int il, int seq, int pos, int n, int width, const float *data);
    void *ud;
};

struct dsv4_spec_undo;
struct dsv4_ep;

/* One sequence's part of a forward step. */
struct dsv4_fwd_seq {
    struct dsv4_seq_state *st;
    const int             *tokens;     /* [n] */
    int                    n;
    int                    n_logits;   /* logits for the last n_logits positions of the chunk */
    float                 *logits;     /* [n_logits, vocab] */
    float                 *mtp_logits; /* [n, vocab] or NULL: MTP head for positions whose next token
                                          is known (pos0-1 .. pos0+n-2) */
    int                    n_mtp;      /* out: MTP rows written */
    /* A speculative verify chunk (spec.c): what its rejected rows would need to be undone is
     * recorded here, for dsv4_spec_rollback; NULL for every other chunk. */
    struct dsv4_spec_undo *undo;
    /* dsv4_forward_draft only: 0 = the pending MTP row (position st->mtp_pos, the main
     * model's streams), d >= 1 = the d-th chained row after it (the previous draft row's MTP
     * output streams, st->mtp_h). */
    int                    draft_depth;
};

/*
 * Scratch for one step of up to max_rows token rows, planned once. Two parts: buffers the
 * ops read and write, allocated by the backend (its memory, DSV4_MEM_ACT), and the step's
 * small host metadata (positions, tokens, the batch table) that the host fills and the
 * ops take as host arrays.
 */
struct dsv4_step {
    int   max_rows;
    int   max_ctx;
    int   max_attn_rows;
    /* ---- backend buffers */
    float *X, *Xn, *Xm;        /* [max_rows, hc, d_model] hyper-connection streams */
    float *u, *f;              /* [max_rows, d_model] */
    float *post, *comb;        /* [max_rows, hc], [max_rows, hc, hc] */
    float *qr;                 /* [max_rows, q_lora_rank] */
    float *q, *o;              /* [max_rows, n_head * d_head] */
    float *kv;                 /* [max_rows, d_head] */
    float *z;                  /* [max_rows, o_groups * o_lora_rank] */
    float *ca, *cg;            /* [max_rows, 2 * d_head] compressor values / gates */
    float *crows;              /* [max_rows + 1, max(d_head, d_idx_head)] pooled rows of a chunk */
    float *qi;                 /* [max_rows, n_idx_head * d_idx_head] */
    float *wi;                 /* [max_rows, n_idx_head] */
    int   *isel, *n_isel;      /* [max_rows, idx_topk], [max_rows] the indexer's choice */
    float *xe, *ye;            /* [max_rows * n_exp_used, d_model] rows gathered per expert */
    float *row_w;              /* [max_rows * n_exp_used] */
    int   *pair_of;            /* [max_rows * n_exp_used] pair of each (row, slot) */
    int   *grp;                /* [2 * n_exp + 2] group table: count, expert ids, first pairs (backend.h) */
    float *shared_y;           /* [max_rows, d_model] the shared expert's output */
    float *exp_scratch;        /* [2 * max(max_rows * n_exp_used, max_rows) * d_ff_exp] */
    float *router_scratch;     /* [(max_rows + 1) * n_exp] */
    int   *ids;                /* [max_rows, n_exp_used] */
    float *rw;                 /* [max_rows, n_exp_used] */
    float *hid;                /* [max_rows, d_model] final hidden */
    uint8_t *staging;          /* [max_rows, row_bytes] this chunk's KV rows, encoded */
    float *logits_dev;         /* [max_rows, vocab] when the backend is not host-visible, else NULL */
    /* ---- host metadata */
    int   *pos, *tok;          /* [max_rows] */
    int   *cpos;               /* [max_rows + 1] first positions of a chunk's compressed rows */
    /* ---- DeepSeek-V4.1 (empty for V4) */
    float   *lag;              /* [max_rows, hc] the lagged hyper-connection mix (backend) */
    int     *cand;             /* [max_rows, cand_topk_blocks] candidate blocks (backend) */
    float   *ckeys;            /* [max_rows + 1, d_idx_head] index keys of a chunk's groups (backend) */
    float   *erows, *ekv;      /* [max_rows, n_cols * engram_d_head], [max_rows, (hc + 1) d_model] (backend) */
    int64_t *eids;             /* [max_rows, n_engram * n_cols] Engram row ids (host) */
    int32_t *ecomp;            /* [max_rows] compressed token ids (host) */
    /* ---- DeepSeek-V4.1 DSpark drafting (dspark.c; empty without DSpark stages) */
    float   *mh;               /* [max_rows, n_dspark_target * d_model] the target layers' mean streams */
    float   *mmix;             /* [max_rows, hc] 1 / hc: the mean as a collapse (backend) */
    float   *dconf;            /* [max_rows, d_model + markov_rank] a draft row's collapsed streams and
                                  the Markov embedding of the token before it: the confidence input */
    float   *conf;             /* [max_rows] the confidence of each draft row (backend) */
    float   *mbias;            /* [max(1, max_rows / dspark_block), vocab] Markov logits, a row per
                                  sequence of a draft step (backend) */
    /* the batch of the current step (set by dsv4_forward) */
    struct dsv4_fwd_seq *seqs;
    int                  n_seqs;
    int   *seq_row0, *seq_n, *seq_pos0; /* [max_rows] first row, rows and first position of each */
    struct dsv4_step_seq *dseq;          /* [max_rows] the step descriptor's sequences */
    struct dsv4_step_desc desc;          /* the step's descriptor (dsv4_step_describe) */
    struct dsv4_backend be;
    struct dsv4_dump_sink dump;
    float *dump_host;          /* [dump_floats] dumped rows downloaded from a backend that is
                                  not host-visible (dump.c), NULL otherwise */
    size_t dump_floats;
    const struct dsv4_model *m; /* whose backend owns dev */
    void  *dev, *host;
    size_t dev_bytes, host_bytes;
};

size_t dsv4_step_bytes(const struct dsv4_model *m, int max_rows, int max_ctx);
/* The part of it the routed experts use for max_rows token rows (the rows gathered per expert
 * in and out, their weights and groups, the experts' hidden rows, the backend's scratch): what
 * a rank that only runs experts allocates (rank_plan.c). */
size_t dsv4_step_expert_bytes(const struct dsv4_model *m, int max_rows);
/* Builds the step descriptor of the n_rows rows laid out in S (seqs, seq_*, pos, tok) and
 * hands it to the backend (step_begin): once per step, before the layers run. */
void   dsv4_step_describe(struct dsv4_step *S, int n_rows);
/* The sequences of one step share a state layout (page size, page bytes): the descriptor's
 * per-layer offsets hold for all of them. DSV4_EINVAL otherwise. */
int    dsv4_step_check_layout(const struct dsv4_fwd_seq *seqs, int n_seqs, struct dsv4_err *err);
int    dsv4_step_init(struct dsv4_step *s, const struct dsv4_model *m, int max_rows, int max_ctx,
                      struct dsv4_err *err);
void   dsv4_step_free(struct dsv4_step *s);

/*
 * One forward step over n_seqs chunks (each of one sequence, rows concatenated, total rows
 * <= step->max_rows). Checks token ids and context room first (DSV4_ERANGE, nothing
 * changed); then advances every sequence. Allocates nothing.
 */
int dsv4_forward(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_fwd_seq *seqs, int n_seqs,
                 struct dsv4_err *err);

/*
 * One MTP row per sequence (speculative drafting, docs/SPECULATIVE.md): the MTP block at the
 * position given by draft_depth with token tokens[0] (the token after that position), its
 * logits into mtp_logits [1, vocab] (predicting the token two after the position), its output
 * streams into st->mtp_h. The pending row (depth 0) is the MTP row a forward step would run
 * next, and counts as done (st->mtp_pos advances); chained rows leave the state's frontier
 * where it is (their ring rows are overwritten before anything reads them).
 */
int dsv4_forward_draft(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_fwd_seq *seqs, int n_seqs,
                       struct dsv4_err *err);

/*
 * Undo of a speculative verify chunk (spec.c). Before a chunk of n <= n_max rows runs with
 * fwd_seq.undo set, nothing is saved by the caller: the forward records the compressor
 * frontier rows the chunk overwrites, the chunk's compressor inputs and its final streams.
 * dsv4_spec_rollback then keeps the first `keep` rows: the frontiers are restored and the
 * kept rows' inputs replayed through the same compress op (the same bits as a chunk of keep
 * rows), the position and the MTP frontier step back. Window rings need nothing (kv.h:
 * ring_rows), compressed rows and indexer keys of rejected blocks are rewritten before they
 * are read.
 */
struct dsv4_spec_comp {
    float *kv, *sc; /* saved frontier rows */
    float *a, *g;   /* the chunk's compressor inputs [n_max, width] */
    int    rows;    /* frontier rows saved */
};

struct dsv4_spec_undo {
    int                    n_max;
    int                    p0, n;  /* the chunk recorded (n = 0: none) */
    int                    n_layer;
    struct dsv4_spec_comp *comp;   /* [n_layer][2]: main compressor, indexer compressor */
    float                 *xf;     /* [n_max, hc, d_model] the chunk's final main streams (V4) */
    /* V4.1: the Engram history before the chunk and the chunk's compressed ids (engram_fwd.c) */
    bool                   engram_saved;
    struct dsv4_engram_seq engram_hist;
    int32_t                engram_ids[DSV4_SPEC_MAX_DRAFT + 1];
    struct dsv4_kv_mem     kvmem;
    void                  *mem;
    size_t                 mem_bytes;
};

size_t dsv4_spec_undo_bytes(const struct dsv4_config *c, int n_max);
int    dsv4_spec_undo_init(struct dsv4_spec_undo *u, const struct dsv4_model *m, int n_max, struct dsv4_err *err);
void   dsv4_spec_undo_free(struct dsv4_spec_undo *u);
/* compress.c calls this before a verify chunk's compress op runs. */
void   dsv4_spec_save_compressor(struct dsv4_step *S, struct dsv4_spec_undo *u, int il, bool is_indexer,
                                 const struct dsv4_layer_state *ls, int d, const float *a, const float *g, int n,
                                 int p0);
/* Keeps rows [0, keep) of the recorded chunk (1 <= keep <= n); S: any step of the model (its
 * backend and compressor scratch). */
void   dsv4_spec_rollback(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_seq_state *st,
                          struct dsv4_spec_undo *u, int keep);

/* Sublayers (attention.c, moe.c), rows [0, R) with S->pos / S->tok filled. `state` is the
 * index of the layer's state in each sequence (il, or n_layer for the MTP block). */
void dsv4_attention_sublayer(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L,
                             int state, int R);
/* compress.c: one compressor over every sequence's rows of the step (inputs in S->ca / S->cg,
 * rows by step row); st: a sequence of the step whose state gives the layer's offsets. */
void dsv4_compress_step(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_compressor_w *cw,
                        bool is_indexer, const struct dsv4_seq_state *st, int state, int il);
/* compress.c: each verify chunk's undo record of layer il's compressor (inputs in S->ca /
 * S->cg, W floats a row), before the compress op moves its frontier. */
void dsv4_compress_save_undo(struct dsv4_step *S, int il, bool is_indexer, int state, int d, size_t W);
void dsv4_moe_sublayer(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R);
/* attention.c, shared with V4.1: the chunk's rows into staging, attention over the window
 * and the rows of S->isel (when sel), the ring update; then inverse RoPE and the grouped
 * output projection into S->f. */
void dsv4_attend_rows(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int state,
                      bool sel);
void dsv4_attn_output(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R);
/* attention.c: a sequence of the step with rows (its state gives every layer's offsets); the
 * indexer's queries and weights of rows [0, R) (S->qi, S->wi; V4: Hadamard-rotated); its
 * selection into S->isel / S->n_isel over the keys of k->keys_source (cand: V4.1's
 * candidate blocks, NULL without). */
const struct dsv4_seq_state *dsv4_layout_seq(const struct dsv4_step *S);
void dsv4_indexer_queries(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R);
void dsv4_indexer_select(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_seq_state *st,
                         const struct dsv4_layer_kind *k, int il, const struct dsv4_idx_cand *cand);
/* compress.c: the first positions of the groups of r positions the step's chunks complete,
 * packed sequence after sequence, into S->cpos; returns their count. */
int  dsv4_group_positions(struct dsv4_step *S, int r);
/* forward.c: one block over rows [0, R) (*X the streams in and out, *Xn scratch), and V4.1's
 * identity first mix of rows [0, R) (make_identity_pre_mix) into S->lag. */
void dsv4_block(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int state, int R,
                float **X, float **Xn);
void dsv4_v41_identity_lag(const struct dsv4_model *m, struct dsv4_step *S, int R);

/*
 * DeepSeek-V4.1's DSpark drafting (dspark.c, docs/SPECULATIVE.md). The main forward keeps
 * each stage's ring: for every position it runs of a sequence with DSpark state
 * (st->has_mtp), main_x = main_norm(main_proj(the target layers' mean streams)), and per
 * stage its window row of main_x.
 *   dsv4_dspark_wanted: a sequence of the step has DSpark state;
 *   dsv4_dspark_capture: at the entry of main layer il, when it is a target, the mean over
 *     the streams X into its columns of S->mh;
 *   dsv4_dspark_rings: main_x of the step's rows and the stages' ring rows.
 * A draft (dsv4_forward_draft on a V4.1 model) of each sequence (tokens[0] = the token at
 * st->pos, known but not fed yet) runs the draft block [tokens[0], noise x (B - 1)] at
 * positions pos .. pos + B - 1 through every stage and writes its B raw logits rows to
 * mtp_logits [B, vocab] (n_mtp = B); it changes no state. dsv4_dspark_markov then adds to row i
 * of each sequence the Markov logits of prev[s] (the token before row i's: tokens[0] for
 * i = 0, then the draft taken from row i - 1), and dsv4_dspark_confidence gives each
 * sequence's rows' confidence (rows 0 .. i after Markov rounds 0 .. i) into conf [n_seqs, B].
 * Both take the draft call's seqs, in its order.
 */
bool dsv4_dspark_wanted(const struct dsv4_step *S);
void dsv4_dspark_capture(const struct dsv4_model *m, struct dsv4_step *S, int il, int R, const float *X);
void dsv4_dspark_rings(const struct dsv4_model *m, struct dsv4_step *S, int R);
int  dsv4_forward_dspark(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_fwd_seq *seqs, int n_seqs,
                         struct dsv4_err *err);
int  dsv4_dspark_markov(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_fwd_seq *seqs, int n_seqs, int i,
                        const int32_t *prev, struct dsv4_err *err);
int  dsv4_dspark_confidence(const struct dsv4_model *m, struct dsv4_step *S, int n_seqs, float *conf,
                            struct dsv4_err *err);

/* attention_v41.c: DeepSeek-V4.1's attention sublayer (docs/MODEL.md §6); its window KV
 * row kv_norm(wkv(S->u)) with RoPE, FP8-simulated per 32, into S->kv (also the DSpark
 * stages' ring rows, dspark.c). */
void dsv4_v41_window_kv(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R);
void dsv4_attention_v41(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R);
/* engram_fwd.c: the Engram row ids of every row of the step (host, advances each sequence's
 * history), checked first: DSV4_ERANGE for a token the map lacks, nothing changed. */
int  dsv4_engram_check(const struct dsv4_model *m, const struct dsv4_fwd_seq *seqs, int n_seqs, struct dsv4_err *err);
void dsv4_engram_hash_step(const struct dsv4_model *m, struct dsv4_step *S);
/* The Engram lookup of layer L on the streams X [R, hc, d_model]. */
void dsv4_engram_layer(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R,
                       float *X);

/* engine.c internals for tools that look inside (dsv4 align, tests). */
const struct dsv4_model *dsv4_engine_model(const dsv4_engine *e);
const struct dsv4_logger *dsv4_engine_logger(const dsv4_engine *e);
/* What computes this engine's KV, as text for dsv4_model_kv_identity: the backend, its level
 * and the options that choose its kernels. */
void dsv4_engine_compute_text(const dsv4_engine *e, char *out, size_t cap);

/* The identity of this model's prefix-cache payloads on disk (kv_identity.c): SHA-256 over
 * what shapes a page and a snapshot and what computes it (compute: the backend, its level
 * and its kernel options, as text). mtp_state: the snapshots carry the MTP block's state.
 * DSV4_ENOMEM only. */
int dsv4_model_kv_identity(const struct dsv4_model *m, const char *compute, bool mtp_state, int page_tokens,
                           size_t page_bytes, size_t snap_bytes, uint8_t out[32]);
int                      dsv4_session_set_dump(dsv4_session *s, struct dsv4_dump_sink sink, struct dsv4_err *err);

/* KV memory from the model's backend. */
static inline struct dsv4_kv_mem dsv4_model_kv_mem(const struct dsv4_model *m)
{
    return (struct dsv4_kv_mem){ .kind = m->backend, .impl = m->backend_impl };
}

static inline const struct dsv4_rope_table *dsv4_layer_rope(const struct dsv4_model *m, int ratio)
{
    return ratio ? &m->rope_comp : &m->rope_swa;
}

/* A stage dump of host data (logits in the caller's buffer, values the host built). */
static inline void dsv4_dump(struct dsv4_step *S, const char *stage, int il, int seq, int pos, int n, int width,
                             const float *data)
{
    if (S->dump.fn) S->dump.fn(S->dump.ud, stage, il, seq, pos, n, width, data);
}

/* dump.c: sets the step's sink; on a backend that is not host-visible also allocates the host
 * buffer the dumped rows are downloaded into (DSV4_ENOMEM: no sink then). */
int  dsv4_step_set_dump(struct dsv4_step *S, struct dsv4_dump_sink sink, struct dsv4_err *err);
/* A stage dump of rows in backend memory (a step buffer): in place on a host-visible backend,
 * else through download into the step's dump buffer. */
void dsv4_dump_dev(struct dsv4_step *S, const char *stage, int il, int seq, int pos, int n, int width,
                   const float *data);
/* bytes of backend memory to a host buffer, for what a dump derives on the host (router ids,
 * the indexer's selection): download and sync, whatever the backend. */
void dsv4_dump_read(struct dsv4_step *S, void *dst, const void *src, size_t bytes);

#endif
