/*
 * dsv4.h - the only public header of libdsv4, an inference engine for DeepSeek-V4.
 *
 * Two opaque handles:
 *   dsv4_engine   loaded weights and config; immutable after open, shareable across threads.
 *   dsv4_session  one token timeline (sliding-window ring, compressor frontiers, compressed
 *                 KV rows, indexer keys, logits); used by one thread at a time.
 *
 * Conventions:
 *   - Functions named as actions return int: 0 (DSV4_OK) or a negative enum dsv4_status code.
 *   - They take an optional `struct dsv4_err *err` last; on failure it receives one human
 *     sentence naming the object at fault. err may be NULL. The struct is caller-owned, so
 *     concurrent requests never share error state.
 *   - Nothing in the library calls exit(); memory is allocated only when opening or creating.
 */
#ifndef DSV4_H
#define DSV4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_VERSION_STRING "0.1.0"

/* Most draft tokens one speculative decoding step verifies (dsv4_session_spec_step). */
#define DSV4_SPEC_MAX_DRAFT 7
/* The draft count the tools (run, chat, batch, serve) use when a checkpoint has an MTP block
 * and none is given (docs/SPECULATIVE.md: how it was chosen). */
#define DSV4_SPEC_DRAFT_DEFAULT 0

enum dsv4_status {
    DSV4_OK           = 0,
    DSV4_EINVAL       = -1,  /* bad argument or option */
    DSV4_ENOMEM       = -2,  /* allocation failed (only at open/create) */
    DSV4_EIO          = -3,  /* file could not be opened, read or mapped */
    DSV4_EFORMAT      = -4,  /* malformed file (checkpoint, JSON, tokenizer) */
    DSV4_ECHECKPOINT  = -5,  /* well-formed files but the wrong tensors for the config */
    DSV4_ERANGE       = -6,  /* value out of range (token id, position past context) */
    DSV4_EUNSUPPORTED = -7,  /* a feature this build or model does not support */
    DSV4_EFULL        = -8,  /* a fixed-size resource is exhausted (queue, pages) */
    DSV4_ECANCELED    = -9,  /* the operation was cancelled */
    DSV4_EINTERNAL    = -10, /* invariant broken inside the library (a bug) */
};

/* Static string for a status code ("invalid argument", ...). Never NULL. */
const char *dsv4_status_str(int status);

#define DSV4_ERR_MSG_MAX 1024

/* Caller-owned error report: the status and one sentence that names the object at fault. */
struct dsv4_err {
    int  code;
    char msg[DSV4_ERR_MSG_MAX];
};

/* Log levels for the optional log callback. */
enum dsv4_log_level {
    DSV4_LOG_ERROR = 0,
    DSV4_LOG_WARN  = 1,
    DSV4_LOG_INFO  = 2,
    DSV4_LOG_DEBUG = 3,
};

typedef void (*dsv4_log_fn)(void *ud, enum dsv4_log_level level, const char *msg);

typedef struct dsv4_engine  dsv4_engine;
typedef struct dsv4_session dsv4_session;
typedef struct dsv4_sampler dsv4_sampler;

/* Which revision of the official demo to reproduce (docs/MODEL.md, "Revisions"). */
enum dsv4_revision {
    DSV4_REVISION_CURRENT = 0, /* shared-expert clamp, true e4m3 rounding of cached KV */
    DSV4_REVISION_INITIAL = 1, /* first release: no shared clamp, KV FP8 simulation a no-op */
};

struct dsv4_engine_params {
    dsv4_log_fn        log;       /* optional; every checkpoint problem is logged here */
    void              *log_ud;
    enum dsv4_revision revision;
    int                n_threads; /* 0 = all online CPUs */
    /* The backend by name: NULL or "" = the default ("cpu", the one this build has; tools:
     * --backend). */
    const char        *backend;
    /* The backend's own options: "key=value" entries separated by commas (a piece without
     * '=' continues the value before it; a key given twice takes the last value), parsed by
     * the backend, which refuses a key it does not know, naming itself and the key. NULL or
     * "" = its defaults. The CPU's (cpu and cpu-staged; docs/BACKENDS.md):
     *   level=L      the code path: the best this CPU has by default; "scalar", "avx2",
     *                "avx512", "avx512bf16", "amx" cap it (a level above the CPU's runs the
     *                CPU's best; one this build lacks is DSV4_EUNSUPPORTED); "ref" = the
     *                double-precision reference ops (bit-exact with the Python reference);
     *                "avx2-int" / "avx512-int" = avx2 / avx512 with exact FP4 block sums
     *                on integer dot products (their own bits; avx512-int is avx2-int on a
     *                CPU without AVX-512; docs/PERF.md "The avx2-int and avx512-int
     *                sub-levels")
     *   gemm_min=A,B,C  the token counts (FP8, FP4, BF16) from which the avx2/avx512/neon f32
     *                kernels take their GEMM instead of the GEMV (the same bits either way;
     *                this engine's own); default: measured for this core (docs/PERF.md)
     *   tiles=0|1    interleaved weight tiles on the levels that use them (default 1; 0 runs
     *                on the checkpoint's own layout)
     * Tools: --backend-opt K=V, and the spellings --cpu-level (DSV4_CPU), --gemm-min
     * (DSV4_GEMM_MIN), --no-tiles (DSV4_TILES=0). */
    const char        *backend_opts;
    /* Write a Chrome/Perfetto trace of every op call here and print each op's share of the
     * time at close; NULL = off (tools: --profile F or DSV4_PROFILE). */
    const char        *profile_path;
    /* Expert parallelism over MPI (docs/DISTRIBUTED.md; tools: --ep N, --ep-dispatch): the
     * ranks the routed experts are spread over, 0 or 1 = this process alone. It must equal
     * the ranks mpirun started, this process being rank 0 (dsv4_mpi_start). */
    int                ep;
    enum dsv4_ep_dispatch {
        DSV4_EP_ROWS   = 0, /* each rank gets the rows routed to its experts (default) */
        DSV4_EP_TOKENS = 1, /* each rank gets the layer's token rows and the routing */
    } ep_dispatch;
};

/*
 * MPI (docs/DISTRIBUTED.md). A program started by mpirun calls dsv4_mpi_start first: it
 * initialises MPI (nothing happens, and it returns 0, outside mpirun or in a build without
 * MPI) and returns this process's rank. Rank 0 runs the program; every other rank calls
 * dsv4_mpi_serve, which loads and runs the experts rank 0's engines ask for until rank 0
 * calls dsv4_mpi_finish (which ends MPI; call it once, on the way out, on every rank).
 * dsv4_mpi_ranks: the ranks mpirun started (1 outside mpirun).
 */
int  dsv4_mpi_start(int *argc, char ***argv);
int  dsv4_mpi_ranks(void);
int  dsv4_mpi_serve(void);
void dsv4_mpi_finish(void);

/* Fills params with defaults (no logging, current revision, all CPUs, the default backend
 * with its default options). */
void dsv4_engine_params_default(struct dsv4_engine_params *params);

/*
 * Opens a checkpoint directory (official Hugging Face layout: config.json, *.safetensors,
 * optional model.safetensors.index.json). Every tensor is checked against the config before
 * this returns; on DSV4_ECHECKPOINT every problem has been passed to params->log and err
 * holds the count and the first one.
 */
int  dsv4_engine_open(dsv4_engine **out, const char *dir, const struct dsv4_engine_params *params,
                      struct dsv4_err *err);
void dsv4_engine_close(dsv4_engine *engine);

struct dsv4_model_info {
    int  vocab_size;
    int  d_model;
    int  n_layer;
    int  n_head;
    int  n_exp;
    int  n_exp_used;
    int  max_ctx;      /* max_position_embeddings */
    bool has_mtp;      /* the checkpoint carries a usable MTP block (DeepSeek-V4.1: its DSpark stages) */
    int  dspark_block; /* DeepSeek-V4.1: rows one DSpark draft gives (dspark_block_size), else 0 */
    int  bos_id;
    int  eos_id;
};

void dsv4_engine_info(const dsv4_engine *engine, struct dsv4_model_info *info);

/* The options an open engine runs with, as resolved at open: its backend, the code path that
 * runs (a level above the CPU's is capped to the CPU's), the threads of its pool, the GEMM
 * crossovers in use. Front ends report them (`dsv4 serve`: a startup line and /metrics).
 * The strings are static. */
struct dsv4_engine_settings {
    const char        *backend;     /* "cpu", "cpu-staged" */
    const char        *level;       /* "ref", "scalar", "avx2", "avx512", ...; "" when the backend has none */
    int                n_threads;   /* threads of the engine's pool */
    int                gemm_min[3]; /* FP8, FP4, BF16 crossovers of the f32 kernels (option gemm_min), 0 when none */
    bool               tiles;       /* the backend repacks weights into its own layout (option tiles) */
    enum dsv4_revision revision;
    bool               profiling;   /* an op trace is written (params.profile_path) */
    int                ep_ranks;    /* MPI ranks the routed experts are spread over (params.ep; 1 = alone) */
    enum dsv4_ep_dispatch ep_dispatch; /* how a MoE layer's rows reach them (params.ep_dispatch) */
};

void dsv4_engine_settings(const dsv4_engine *engine, struct dsv4_engine_settings *settings);

/* What expert parallelism moved, counted on rank 0 since the engine opened (all zero in one
 * process): bytes rank 0 sent to and received from the other ranks for the MoE layers, the
 * layers that went through MPI, and the wall time rank 0 spent inside MPI calls there
 * (sending, and waiting for the other ranks' results after computing its own). */
struct dsv4_ep_stats {
    int      ranks;
    uint64_t bytes_sent, bytes_received;
    uint64_t layers;
    double   mpi_seconds;
};

void dsv4_engine_ep_stats(const dsv4_engine *engine, struct dsv4_ep_stats *stats);
/* The read bandwidth of every rank's memory over a buffer of bytes (best of reps, GB/s), all
 * ranks at once, into gbps[ranks] (-1 where it could not be measured: a backend without the
 * measurement, no memory for the buffer); returns the ranks (1 in one process). */
int  dsv4_engine_ep_bandwidth(const dsv4_engine *engine, size_t bytes, int reps, double *gbps);

/* Reads every page of the weights the backend reads in place from the mapped checkpoint
 * (not those it copied into its own layout), so that they are in memory and mapped before
 * the first request: a hot standby's warm-up (`dsv4 serve --standby`). Returns the bytes
 * read, -1 when out of memory. */
int64_t dsv4_engine_make_resident(dsv4_engine *engine);

/* ==================================================================================== */
/* Sessions: one token timeline each (src/engine/engine.c)                              */
/* ==================================================================================== */

struct dsv4_session_params {
    int  max_ctx;   /* most tokens the session will hold (KV memory is sized from it) */
    int  max_chunk; /* most tokens per forward call; longer inputs are split (scratch size) */
    bool mtp;       /* keep the MTP block's state so MTP logits can be asked for */
    int  spec_draft; /* most draft tokens of dsv4_session_spec_step, 0 .. DSV4_SPEC_MAX_DRAFT (needs
                        mtp); 0 = none */
};

/* max_ctx 4096 (or the model's limit if smaller), max_chunk 512, no MTP. */
void dsv4_session_params_default(struct dsv4_session_params *params);

/* Bytes a session with these parameters allocates (KV state plus step scratch). */
size_t dsv4_session_memory_estimate(const dsv4_engine *engine, const struct dsv4_session_params *params);

/* Allocates everything the session will ever use; evaluating tokens allocates nothing. */
int  dsv4_session_create(dsv4_engine *engine, const struct dsv4_session_params *params, dsv4_session **out,
                         struct dsv4_err *err);
void dsv4_session_free(dsv4_session *s);

/*
 * Feeds n tokens (any n >= 1: a prefill, a single decode token, or any chunk). When logits is
 * not NULL it receives [n, vocab] f32 logits, row t after tokens[..t]; the logits after the
 * last token are always available from dsv4_session_logits(). With MTP enabled, mtp_logits
 * (if not NULL, room for [n, vocab]) receives the MTP head's logits for every position whose
 * next token became known with this call (the previous call's last position, then all but
 * the last of these), and *n_mtp their count; row i predicts the token two after its
 * position. Token ids out of range or a full context give DSV4_ERANGE and change nothing.
 */
int dsv4_session_eval(dsv4_session *s, const int32_t *tokens, int n, float *logits, float *mtp_logits, int *n_mtp,
                      struct dsv4_err *err);

/*
 * Speculative decoding with the MTP block (docs/SPECULATIVE.md). `next` is the token that
 * follows the session's tokens (chosen by the caller from dsv4_session_logits()). The MTP
 * block drafts up to k tokens (drawn by smp from its logits), the model evaluates next and
 * the drafts in one step, and dsv4_sampler_verify keeps a prefix of the drafts: out[0 ..
 * *n_out) receives the kept drafts and then one token chosen from the model's logits after
 * them (1 <= *n_out <= k + 1). On return the session holds next and the kept drafts;
 * dsv4_session_logits() is the row out[*n_out - 1] was chosen from, and that token is not
 * evaluated yet (it is the next call's `next`). With a greedy sampler, out is exactly what
 * evaluating one token at a time and taking each argmax gives (the same logits, bit for bit);
 * otherwise every token has exactly the distribution dsv4_sampler_sample would give it.
 * logits (optional, room for [k + 1, vocab]) receives in row i the logits out[i] was chosen
 * from. k is capped by the session's spec_draft and its context room; k = 0, or a session
 * holding no token, evaluates next alone and samples one token. Nothing changes on error.
 */
int dsv4_session_spec_step(dsv4_session *s, int32_t next, int k, dsv4_sampler *smp, int32_t *out, int *n_out,
                           float *logits, struct dsv4_err *err);

/*
 * DeepSeek-V4.1 (a session with mtp set on a checkpoint with DSpark stages; docs/SPECULATIVE.md):
 * the DSpark stages' draft after the session's tokens with `next` the token at its position
 * (not evaluated): logits [dspark_block, vocab], row i the draft of the token i + 1 after
 * next, each with the Markov logits of the token before it taken greedily (next, then each
 * row's argmax, lowest id on ties, as tools/ref/model_v41.py `dspark_head`), and conf
 * [dspark_block] each row's confidence. Changes nothing. DSV4_EINVAL before the first token.
 */
int dsv4_session_dspark_rows(dsv4_session *s, int32_t next, float *logits, float *conf, struct dsv4_err *err);

/* Logits [vocab] after the last evaluated token (NULL before the first). */
const float *dsv4_session_logits(const dsv4_session *s);
/* Tokens held so far. */
int dsv4_session_pos(const dsv4_session *s);
/* Forgets every token (keeps the memory). */
void dsv4_session_reset(dsv4_session *s);

/* Saves the session at its position to path (src/engine/session_file.c; docs/FORMAT.md
 * "Saved sessions"): tokens [n_tokens] (the ids it holds, n_tokens == its position), the KV
 * pages in use, the per-sequence state and the last logits, written crash-safely (a temp
 * file renamed over path). DSV4_EINVAL: n_tokens is not the position; DSV4_EIO: the write. */
int dsv4_session_save(const dsv4_session *s, const char *path, const int32_t *tokens, int n_tokens,
                      struct dsv4_err *err);
/* Resets the session and loads a file dsv4_session_save wrote for the same model and session
 * parameters (context, MTP): its tokens into tokens[0, cap), their count into *n_tokens; the
 * next eval continues bit-exactly where the saved session stood, and dsv4_session_logits()
 * is the saved row. Every byte is verified: DSV4_EIO (cannot read), DSV4_EFORMAT (truncated,
 * corrupted, another model's or another version's, or not fitting this session or cap); on
 * any error the session stays reset. */
int dsv4_session_load(dsv4_session *s, const char *path, int32_t *tokens, int cap, int *n_tokens,
                      struct dsv4_err *err);

/* A prompt cache on disk for one session at a time (src/engine/session_cache.c;
 * docs/SERVING.md "Disk tier", docs/FORMAT.md "Session-cache records"): whole-session
 * records at the page boundaries (every 256 tokens) of the prompts it evaluates, in the
 * kv-disk store DIR/session (a budget in bytes with LRU eviction, 0 = 10 GiB; crash-safe;
 * a corrupted or foreign record is removed with a log line and reads as a miss). */
typedef struct dsv4_prompt_cache dsv4_prompt_cache;

/* Opens the store for sessions like s (same model, compute and MTP setting: the records'
 * identity). DSV4_EIO: the directory cannot be used, or another live process holds it (the
 * message names it and the holder's pid). */
int         dsv4_prompt_cache_open(dsv4_prompt_cache **out, const dsv4_session *s, const char *dir, uint64_t budget,
                                   struct dsv4_err *err);
void        dsv4_prompt_cache_close(dsv4_prompt_cache *pc);
/* The store's directory (DIR/session). */
const char *dsv4_prompt_cache_dir(const dsv4_prompt_cache *pc);

struct dsv4_prompt_cache_eval {
    bool   probed;  /* the session held nothing, so the store was searched */
    int    loaded;  /* tokens loaded from a record (0: no cached prefix) */
    double load_ms; /* the search and the load */
    int    saved;   /* the boundary a new record was stored at, 0 when none */
};

/* Evaluates tokens[pos, n) where the session holds tokens[0, pos) (n > pos). When pos is 0 it
 * first loads the deepest stored record of the prompt's whole pages whose token ids equal
 * the prompt's. Then, when the deepest page boundary P <= n lies past what it holds, it
 * evaluates up to P, stores the record at P, and evaluates the rest: the session ends bit
 * for bit as one dsv4_session_eval of the tokens would leave it. Errors are the eval's. */
int dsv4_prompt_cache_eval(dsv4_prompt_cache *pc, dsv4_session *s, const int32_t *tokens, int n,
                           struct dsv4_prompt_cache_eval *res, struct dsv4_err *err);

/* ==================================================================================== */
/* Sampling (src/sched/sampler.c)                                                       */
/* ==================================================================================== */

#define DSV4_MAX_LOGIT_BIAS 300 /* OpenAI's limit on logit_bias entries */

struct dsv4_sampler_params {
    float    temperature; /* 0 = greedy (argmax, lowest id on ties) */
    int      top_k;       /* 0 = off */
    float    top_p;       /* 1 = off */
    float    min_p;       /* 0 = off: drop tokens below min_p * p(most likely) */
    uint64_t seed;
    /* Logit adjustments, before everything above (greedy included), in this order:
     *   1. logit_bias: bias[i] is added to the logit of token bias_id[i];
     *   2. repetition_penalty r (1 or 0 = off): a token of the prompt or generated so far has
     *      its logit divided by r when positive, multiplied by r otherwise;
     *   3. frequency_penalty f and presence_penalty p (0 = off): a token generated c times
     *      so far loses f * c + p * (c > 0).
     * The generated tokens are those passed to dsv4_sampler_accept; the prompt's, those
     * passed to dsv4_sampler_prime. */
    float    presence_penalty, frequency_penalty, repetition_penalty;
    /* 4. a JSON constraint (not owned; NULL = none): tokens that cannot continue the text
     *    get -inf; it advances with dsv4_sampler_accept. */
    struct dsv4_constraint *constraint;
    int      n_bias;
    int32_t  bias_id[DSV4_MAX_LOGIT_BIAS];
    float    bias[DSV4_MAX_LOGIT_BIAS];
};

void dsv4_sampler_params_default(struct dsv4_sampler_params *p); /* greedy */
int  dsv4_sampler_create(dsv4_sampler **out, int vocab, const struct dsv4_sampler_params *p,
                         struct dsv4_err *err);
void dsv4_sampler_free(dsv4_sampler *s);
/* Picks a token from logits [vocab]; deterministic for a given seed and call sequence.
 * If prob is not NULL it receives the chosen token's probability under the filtered
 * distribution (1 for greedy). */
int32_t dsv4_sampler_sample(dsv4_sampler *s, const float *logits, float *prob);
/* The penalties' history: the prompt (repetition penalty), and each token generated (all
 * three), in order. Neither allocates. */
void    dsv4_sampler_prime(dsv4_sampler *s, const int32_t *prompt, int n);
void    dsv4_sampler_accept(dsv4_sampler *s, int32_t token);
/* Whether the sampler's distribution depends on the tokens generated so far (a penalty is
 * on): then speculative drafts cannot be verified exactly and are not made. */
bool    dsv4_sampler_has_history(const struct dsv4_sampler_params *p);
/* Speculative decoding: the verdict on one draft token. target: the model's logits [vocab] at
 * the draft's position; draft_logits: the logits [vocab] the draft token was sampled from
 * (with this same sampler's filters, by dsv4_sampler_sample). Greedy (temperature 0): the
 * draft is accepted iff it is the target's argmax (ties to the lowest id) and the returned
 * token is that argmax either way. Otherwise rejection sampling: accept with probability
 * min(1, p(d)/q(d)) where p and q are the filtered distributions (temperature, top-k, top-p,
 * min-p exactly as dsv4_sampler_sample applies them) of target and draft_logits; on
 * rejection the returned token is drawn from max(0, p - q) renormalised (if that is all zero,
 * from p). The token returned is therefore distributed exactly as dsv4_sampler_sample(target)
 * would be. *accepted says which case happened; prob (if not NULL) receives the returned
 * token's probability under p. Uses the sampler's generator (same seed, same calls: same
 * result). A draft with q(d) = 0 (or an id outside the vocabulary) is rejected. */
int32_t dsv4_sampler_verify(dsv4_sampler *s, const float *target, const float *draft_logits, int32_t draft,
                            bool *accepted, float *prob);

/* ==================================================================================== */
/* Serving: continuous batching over a paged KV pool (src/sched/scheduler.c, src/kv/;   */
/* docs/SERVING.md)                                                                     */
/* ==================================================================================== */

/*
 * A scheduler owns every sequence's model state. Requests are submitted (from any thread)
 * as token ids; each dsv4_sched_step() (from one thread at a time) runs one forward pass over
 * a batch made of one decode row per running sequence plus prefill chunks under a token
 * budget, samples, and reports through each request's callback. Memory is planned and
 * allocated at creation; stepping allocates nothing. A request's greedy output does not
 * depend on what else runs with it, how its prompt is chunked, whether it was preempted or
 * whether its prefix came from the prefix cache.
 */
typedef struct dsv4_sched dsv4_sched;

enum dsv4_tier {
    DSV4_TIER_SHORT  = 0,
    DSV4_TIER_MEDIUM = 1,
    DSV4_TIER_LONG   = 2,
    DSV4_TIER_COUNT  = 3,
};

struct dsv4_sched_params {
    int    max_ctx;            /* most tokens per sequence, prompt + output (KV is planned from it);
                                  0 = 4096 or the model's limit if smaller */
    int    max_seqs;           /* sequences running at once (KV slots) */
    int    max_batch_tokens;   /* token rows per step (decode rows + prefill chunks), >= max_seqs */
    int    max_prefill_tokens; /* prefill rows per step while some sequence decodes (bounds the
                                  latency a long prompt adds to running streams); 0 = no bound */
    float  prefill_share;      /* while some sequence decodes, prefill rows may add at most this
                                  share of a decode-only step's time, as measured while stepping
                                  (1: inter-token latency up to about 2x); 0 = off */
    int    kv_pages;           /* KV pages in the pool; 0 = max_seqs * ceil(max_ctx / page) */
    int    page_tokens;        /* positions per page; 0 = 256 */
    int    prefix_entries;     /* prefix-cache entries (a page and a snapshot each); 0 = no
                                  cache, -1 = 4 per sequence */
    int    max_queue;          /* waiting requests; beyond, submissions get DSV4_EFULL */
    int    tier_tokens[2];     /* prompt tokens up to which a request is short, medium */
    int    tier_max_running[DSV4_TIER_COUNT]; /* running sequences per tier */
    size_t mem_limit;          /* bytes the plan may take; 0 = available RAM minus the weights
                                  and a margin */
    int    spec_draft;         /* speculative decoding (docs/SPECULATIVE.md): most tokens the MTP
                                  block drafts per step for a decoding sequence, 0 .. 7; 0 = off.
                                  Needs a checkpoint with MTP; the slots then carry its state */
    int    spec_max_batch;     /* speculate only while at most this many sequences decode
                                  (beyond, the extra rows cost more than they save); 0 = 4 */
    int    keep_finished;      /* finished sequences whose slot and pages stay as they ended, so
                                  that a request whose tokens extend theirs resumes exactly at
                                  their end (agent turns; docs/SERVING.md "Kept sequences"); they
                                  give way, least recently finished first, to any request that
                                  needs a slot or pages. 0 = off, -1 = max_seqs */
    const char *kv_disk_dir;   /* the prefix cache's disk tier (docs/SERVING.md "Disk tier"):
                                  published entries are written there and read back after
                                  eviction or a restart; NULL = off. One process per directory */
    uint64_t kv_disk_budget;   /* bytes its files may take; 0 = 10 GiB */
};

/* max_ctx 0 (4096, capped by the model), 8 sequences, 512 rows per step, no speculation; while decoding,
 * prefill rows of at most 128 and a decode step's time (prefill_share 1); prefix cache on,
 * queue of 256, tiers short <= 512 < medium <= 4096 < long with long limited to a quarter of
 * the sequences (at least one). */
void dsv4_sched_params_default(struct dsv4_sched_params *p);

/* The start-up memory plan, by kind. */
struct dsv4_sched_plan {
    int    page_tokens, n_slots, n_pages, n_prefix_entries;
    size_t slot_bytes;     /* one sequence's window rings and compressor frontiers */
    size_t page_bytes;     /* one page: compressed rows and indexer keys of page_tokens positions */
    size_t snapshot_bytes; /* one prefix-cache snapshot (rings, previous compressor blocks) */
    size_t slots, pages, snapshots, tables, step, logits; /* totals per kind */
    size_t spec;           /* speculative decoding: undo buffers and draft logits (0 when off) */
    size_t total;
    size_t mem_limit;      /* the limit the plan was checked against */
    size_t mem_available, weights_bytes, margin; /* how a default limit was derived (else 0) */
};

/* Computes the plan without allocating; DSV4_ENOMEM (err says by how much) when it exceeds
 * the memory limit, DSV4_EINVAL for bad parameters. */
int dsv4_sched_plan(const dsv4_engine *engine, const struct dsv4_sched_params *params,
                    struct dsv4_sched_plan *plan, struct dsv4_err *err);

int  dsv4_sched_create(dsv4_engine *engine, const struct dsv4_sched_params *params, dsv4_sched **out,
                       struct dsv4_err *err);
/* Requests still pending get a DONE event with DSV4_FINISH_CANCELLED first. */
void dsv4_sched_free(dsv4_sched *s);
void dsv4_sched_get_plan(const dsv4_sched *s, struct dsv4_sched_plan *plan);

enum dsv4_finish {
    DSV4_FINISH_NONE      = 0,
    DSV4_FINISH_STOP      = 1, /* a stop id was sampled (reported in the DONE event) */
    DSV4_FINISH_LENGTH    = 2, /* max_tokens generated, or the context is full */
    DSV4_FINISH_CANCELLED = 3, /* dsv4_sched_cancel, or the scheduler was freed */
    DSV4_FINISH_DEADLINE  = 4, /* the request's deadline passed */
    DSV4_FINISH_ERROR     = 5, /* the step failed; the event's status says why */
};

/* "stop", "length", "cancelled", "deadline", "error" ("" for NONE). */
const char *dsv4_finish_str(enum dsv4_finish f);

enum dsv4_sched_event_kind {
    DSV4_SCHED_TOKEN = 0, /* one generated token */
    DSV4_SCHED_DONE  = 1, /* the request ended; the last event it gets */
};

struct dsv4_sched_usage {
    int    prompt_tokens;
    int    completion_tokens; /* sampled tokens, a final stop id included */
    int    cached_tokens;     /* prompt positions resumed from the prefix cache (first admission) */
    int    preemptions;
    double queue_s;           /* submission to first admission */
    double ttft_s;            /* submission to first token (0 when none) */
    double total_s;           /* submission to the end */
};

struct dsv4_sched_event {
    enum dsv4_sched_event_kind kind;
    uint64_t                   id;
    int32_t                    token;  /* TOKEN: the token; DONE: the stop id for FINISH_STOP, else -1 */
    float                      prob;   /* TOKEN: its probability under the sampling filters */
    const float               *logits; /* TOKEN: the [vocab] logits it was sampled from, valid
                                          during the callback only */
    int                        index;  /* TOKEN: 0-based position in the output */
    enum dsv4_finish           finish; /* DONE */
    int                        status; /* DONE with DSV4_FINISH_ERROR: a dsv4_status */
    struct dsv4_sched_usage    usage;  /* DONE */
};

/* Called on the stepping thread, outside the step's no-allocation region; it may call
 * dsv4_sched_submit and dsv4_sched_cancel but not dsv4_sched_step. */
typedef void (*dsv4_sched_event_fn)(void *ud, const struct dsv4_sched_event *ev);

struct dsv4_request {
    const int32_t             *prompt;     /* [n_prompt] token ids, copied */
    int                        n_prompt;   /* >= 1, <= max_ctx */
    int                        max_tokens; /* >= 1 */
    struct dsv4_sampler_params sampling;
    const int32_t             *stop_ids;   /* [n_stop] ids that end the output (EOS ...), copied */
    int                        n_stop;
    double                     deadline_s; /* seconds after submission; 0 = none */
    int                        spec_draft; /* drafts per step: 0 = the scheduler's spec_draft, -1 = none,
                                              K > 0 = at most K (and the scheduler's) */
    dsv4_sched_event_fn        on_event;
    void                      *ud;
};

/*
 * Queues a request (any thread). DSV4_EFULL: the waiting queue is full, retry later
 * (nothing was queued). DSV4_ERANGE: the prompt does not fit the context or the KV pool;
 * DSV4_EINVAL: a bad token id or parameter. *id identifies it in events and cancel.
 */
int dsv4_sched_submit(dsv4_sched *s, const struct dsv4_request *req, uint64_t *id, struct dsv4_err *err);
/* Cancels a request (any thread): it ends with DSV4_FINISH_CANCELLED at the next step
 * boundary, its slot and pages freed. DSV4_EINVAL when the id is not pending. */
int dsv4_sched_cancel(dsv4_sched *s, uint64_t id);
/* Runs one step (one thread at a time). An internal failure ends the requests of the batch
 * with DSV4_FINISH_ERROR and is returned. */
int dsv4_sched_step(dsv4_sched *s, struct dsv4_err *err);
/* True when no request is queued or running. */
bool dsv4_sched_is_idle(dsv4_sched *s);
/* Blocks until a request is pending or timeout_s passes (for a worker loop). */
void dsv4_sched_wait(dsv4_sched *s, double timeout_s);

struct dsv4_sched_metrics {
    int      waiting, running;
    int      running_by_tier[DSV4_TIER_COUNT];
    int      slots_total, slots_used;
    int      pages_total, pages_free;
    int      pages_cached;      /* held by the prefix cache */
    int      pages_evictable;   /* held by the prefix cache alone */
    int64_t  fragmentation;     /* positions of mapped pages that hold no token yet */
    int      prefix_entries;
    uint64_t submitted, refused, finished, cancelled, deadline_expired, errors, preemptions;
    uint64_t steps, prefill_tokens, decode_tokens, generated_tokens;
    uint64_t prefix_lookups, prefix_hits, prefix_hit_tokens, prefix_inserts, prefix_evictions;
    int      seqs_kept;         /* finished sequences kept (keep_finished); their slots are not
                                   in slots_used */
    uint64_t kept_resumes, kept_resume_tokens, kept_evictions; /* requests resumed at a kept
                                   sequence's end, the positions they skipped, kept sequences
                                   that gave way */
    /* speculative decoding: verify steps of a sequence, tokens drafted, drafts kept, and per
     * draft position i how many steps kept it (acceptance at i = kept_at[i] / spec_steps) */
    uint64_t spec_steps, spec_drafted, spec_kept, spec_kept_at[DSV4_SPEC_MAX_DRAFT];
    double   busy_s;            /* time spent stepping */
    /* the prefix cache's disk tier (kv_disk_dir; all 0 when off): records read back and the
     * prompt positions they resumed (part of prefix_hit_tokens), lookups that found none,
     * bytes, records evicted for the budget, bad files removed, failed writes, writes
     * dropped because the queue was full, writes refused for the budget (a record larger
     * than all of it, or no room), writes queued now */
    uint64_t kv_disk_hits, kv_disk_hit_tokens, kv_disk_misses, kv_disk_bytes_read, kv_disk_bytes_written;
    uint64_t kv_disk_evictions, kv_disk_corrupt, kv_disk_write_errors, kv_disk_writes_dropped, kv_disk_refused;
    int      kv_disk_queue_depth;
    /* records read whole from disk (by the prefetching reader thread or on the stepping
     * thread, used or not) and the wall time of those reads, seconds */
    uint64_t kv_disk_loads;
    double   kv_disk_load_s;
    bool     kv_disk_on;
};

/* A consistent snapshot of the counters as of the last step (any thread). */
void dsv4_sched_metrics(dsv4_sched *s, struct dsv4_sched_metrics *m);

/* ==================================================================================== */
/* End of serving                                                                       */
/* ==================================================================================== */

/* ==================================================================================== */
/* Tokenizer and chat format (src/tok/; reference: docs/TOKENIZER.md)                   */
/* ==================================================================================== */

/*
 * A byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json, matching the
 * Hugging Face tokenizers library id for id. Immutable after load: one tokenizer may be
 * used by any number of threads at once. Nothing is ever added implicitly (no BOS, no
 * post-processor template); callers ask for BOS with DSV4_TOKENIZE_BOS.
 */
typedef struct dsv4_tokenizer dsv4_tokenizer;

/* path: a tokenizer.json file, or a directory that holds one. Features that this
 * implementation does not support fail with DSV4_EUNSUPPORTED naming the field. */
int  dsv4_tokenizer_load(dsv4_tokenizer **out, const char *path, struct dsv4_err *err);
/* The same from a JSON document in memory; name is used in error messages. */
int  dsv4_tokenizer_load_json(dsv4_tokenizer **out, const char *json, size_t len, const char *name,
                              struct dsv4_err *err);
void dsv4_tokenizer_free(dsv4_tokenizer *tok);

/* One past the largest id of the vocabulary and the added tokens. */
int32_t dsv4_tokenizer_n_vocab(const dsv4_tokenizer *tok);
/* BOS and EOS: the ids of "<｜begin▁of▁sentence｜>" and "<｜end▁of▁sentence｜>", or 0 and 1
 * when the file lacks them (the DeepSeek defaults). */
int32_t dsv4_tokenizer_bos(const dsv4_tokenizer *tok);
int32_t dsv4_tokenizer_eos(const dsv4_tokenizer *tok);
/* The id of a token given as written in tokenizer.json (an added token's content, or a
 * vocabulary key in its byte-level spelling such as "Ġthe"); DSV4_EINVAL if there is none. */
int  dsv4_tokenizer_token_id(const dsv4_tokenizer *tok, const char *token, int32_t *id,
                             struct dsv4_err *err);
/* The tokenizer.json spelling of id, or NULL for an id that no token uses. */
const char *dsv4_tokenizer_token_str(const dsv4_tokenizer *tok, int32_t id);
/* True for added tokens marked "special": true. */
bool dsv4_tokenizer_is_special(const dsv4_tokenizer *tok, int32_t id);
/* True for every added token (the special ones and the chat-format control tokens such as
 * "<｜User｜>", "</think>", "｜DSML｜"). */
bool dsv4_tokenizer_is_added(const dsv4_tokenizer *tok, int32_t id);
/* The most bytes one token decodes to. */
size_t dsv4_tokenizer_max_token_bytes(const dsv4_tokenizer *tok);

enum dsv4_tokenize_flags {
    DSV4_TOKENIZE_BOS = 1u << 0, /* put the BOS id first */
};

/*
 * Encodes text[0..len) (any bytes; invalid UTF-8 is first replaced by U+FFFD, one per maximal
 * invalid subpart, as every UTF-8 decoder of the reference stack does). Writes at most cap
 * ids and sets *n_ids to the full count; when that exceeds cap it returns DSV4_ERANGE (ids
 * then holds the first cap). 3 * len + 1 ids always suffice.
 */
int dsv4_tokenizer_encode(const dsv4_tokenizer *tok, const char *text, size_t len, unsigned flags,
                          int32_t *ids, size_t cap, size_t *n_ids, struct dsv4_err *err);
/*
 * The same, except that no special or added token is matched where it would cover a byte i
 * with literal[i] != 0: text written by a user (a chat message) is tokenized as ordinary
 * characters even when it spells "<｜Assistant｜>", while the template around it keeps its
 * control tokens. The pieces between matches are split and merged as by
 * dsv4_tokenizer_encode, so text without such spellings gives the same ids. text must be
 * valid UTF-8 (DSV4_EINVAL otherwise); literal == NULL is dsv4_tokenizer_encode.
 */
int dsv4_tokenizer_encode_marked(const dsv4_tokenizer *tok, const char *text, size_t len,
                                 const uint8_t *literal, unsigned flags, int32_t *ids, size_t cap,
                                 size_t *n_ids, struct dsv4_err *err);

/*
 * Decodes ids to the exact bytes they stand for (the ByteLevel decoder without the final
 * UTF-8 repair, so decode(encode(x)) == x for valid UTF-8 x). Writes at most cap bytes and
 * sets *n_out to the full length (DSV4_ERANGE when it exceeds cap). An id that no token
 * uses is DSV4_ERANGE with err naming it.
 */
int dsv4_tokenizer_decode(const dsv4_tokenizer *tok, const int32_t *ids, size_t n_ids, char *out,
                          size_t cap, size_t *n_out, struct dsv4_err *err);

/*
 * Streaming decoder: push ids one at a time and get back only whole UTF-8 characters (a
 * token may end inside a character; those bytes wait for the next push). Bytes that can
 * never form a character become U+FFFD, one per maximal invalid subpart, so the
 * concatenated output equals the reference decode (UTF-8 repaired). Zero-initialise (or
 * dsv4_tokenizer_stream_init) before the first push; no allocation.
 */
struct dsv4_tokenizer_stream {
    unsigned char pending[4]; /* a valid but incomplete UTF-8 prefix */
    unsigned      n_pending;
};

void dsv4_tokenizer_stream_init(struct dsv4_tokenizer_stream *st);
/* Appends the text completed by id to out (n_out = bytes written). out must hold
 * 3 * (dsv4_tokenizer_max_token_bytes(tok) + 3) bytes; DSV4_ERANGE for a smaller cap or an
 * unused id (the stream is left unchanged). */
int dsv4_tokenizer_stream_push(const dsv4_tokenizer *tok, struct dsv4_tokenizer_stream *st,
                               int32_t id, char *out, size_t cap, size_t *n_out,
                               struct dsv4_err *err);
/* Ends the stream: a pending incomplete character becomes U+FFFD (out: 3 bytes suffice). */
void dsv4_tokenizer_stream_flush(struct dsv4_tokenizer_stream *st, char *out, size_t *n_out);

/* ---------------------------------------------------------------- chat encoding */

/*
 * The DeepSeek-V4 chat format of the official encoding/encoding_dsv4.py: messages are
 * rendered to one prompt string (special tokens written as text, BOS included) that
 * dsv4_tokenizer_encode turns into ids. The reverse direction parses generated text into
 * reasoning, content and DSML tool calls, in one go or streaming.
 */
enum dsv4_chat_mode {
    DSV4_CHAT_MODE_CHAT     = 0, /* "chat": the assistant turn opens with </think> */
    DSV4_CHAT_MODE_THINKING = 1, /* "thinking": the last assistant turn opens with <think> */
};

enum dsv4_chat_effort {
    DSV4_CHAT_EFFORT_DEFAULT = 0, /* None: no prefix */
    DSV4_CHAT_EFFORT_HIGH    = 1, /* "high": no prefix in this release of the encoder */
    DSV4_CHAT_EFFORT_MAX     = 2, /* "max": the "Reasoning Effort: Absolute maximum..." prefix
                                     before the first message, thinking mode only */
};

enum dsv4_chat_role {
    DSV4_CHAT_ROLE_SYSTEM          = 0,
    DSV4_CHAT_ROLE_USER            = 1,
    DSV4_CHAT_ROLE_ASSISTANT       = 2,
    DSV4_CHAT_ROLE_TOOL            = 3, /* merged into the user turn as <tool_result> */
    DSV4_CHAT_ROLE_DEVELOPER       = 4,
    DSV4_CHAT_ROLE_LATEST_REMINDER = 5,
};

enum dsv4_chat_task {
    DSV4_CHAT_TASK_NONE      = 0,
    DSV4_CHAT_TASK_ACTION    = 1,
    DSV4_CHAT_TASK_QUERY     = 2,
    DSV4_CHAT_TASK_AUTHORITY = 3,
    DSV4_CHAT_TASK_DOMAIN    = 4,
    DSV4_CHAT_TASK_TITLE     = 5,
    DSV4_CHAT_TASK_READ_URL  = 6,
};

struct dsv4_chat_tool_call {
    const char *id;        /* optional; orders the tool results that follow */
    const char *name;
    const char *arguments; /* JSON object text, as OpenAI's function.arguments */
};

/* One message; every string is UTF-8, NUL-terminated, and may be NULL when unused. */
struct dsv4_chat_message {
    enum dsv4_chat_role               role;
    const char                       *content;
    const char                       *reasoning;       /* assistant: reasoning_content */
    const struct dsv4_chat_tool_call *tool_calls;      /* assistant */
    size_t                            n_tool_calls;
    const char                       *tool_call_id;    /* tool */
    const char                       *tools;           /* system/developer: JSON array of
                                                          OpenAI tools {"type","function"} */
    const char                       *response_format; /* system/developer: JSON value */
    enum dsv4_chat_task               task;            /* user/developer */
    bool                              no_eos;          /* assistant: leave the turn open */
};

struct dsv4_chat_params {
    enum dsv4_chat_mode   mode;
    enum dsv4_chat_effort effort;
    bool                  keep_reasoning; /* drop_thinking=False: keep earlier reasoning */
    bool                  no_bos;         /* add_default_bos_token=False */
};

void dsv4_chat_params_default(struct dsv4_chat_params *params);

/* Renders messages into *out (malloc'd, NUL-terminated, length *out_len; free with free()). */
int dsv4_chat_render(const struct dsv4_chat_message *msgs, size_t n_msgs,
                     const struct dsv4_chat_params *params, char **out, size_t *out_len,
                     struct dsv4_err *err);
/* The same from OpenAI-style JSON: an array of messages, or {"messages": [...], "tools":
 * [...]} whose tools go to the first message (as the official test harness does). */
int dsv4_chat_render_json(const char *json, size_t len, const struct dsv4_chat_params *params,
                          char **out, size_t *out_len, struct dsv4_err *err);
/* The same, and *literal (malloc'd, *out_len bytes, free with free()) marks the bytes that
 * came from the request (message text, reasoning, tool names, arguments and schemas, the
 * response format) with 1 and the template's own text with 0, for
 * dsv4_tokenizer_encode_marked. */
int dsv4_chat_render_json_marked(const char *json, size_t len, const struct dsv4_chat_params *params,
                                 char **out, size_t *out_len, uint8_t **literal, struct dsv4_err *err);

/* A tool call parsed back from DSML; arguments is the JSON text the official parser builds. */
struct dsv4_chat_call {
    char *name;
    char *arguments;
};

struct dsv4_chat_parsed {
    char                  *reasoning; /* NUL-terminated, never NULL after success */
    size_t                 reasoning_len;
    char                  *content;
    size_t                 content_len;
    struct dsv4_chat_call *calls;
    size_t                 n_calls;
};

/* Parses one complete generated assistant turn (text after the prompt, up to and including
 * the EOS text) with the official parser's rules; DSV4_EFORMAT names the first violation. */
int  dsv4_chat_parse(const char *text, size_t len, enum dsv4_chat_mode mode,
                     struct dsv4_chat_parsed *out, struct dsv4_err *err);
void dsv4_chat_parsed_free(struct dsv4_chat_parsed *p);

/* Streaming parser: feed decoded text as it is generated; events report reasoning and
 * content deltas as soon as they cannot be the start of a marker, and each tool call once
 * its </｜DSML｜invoke> has arrived. */
enum dsv4_chat_event_kind {
    DSV4_CHAT_EVENT_REASONING = 0,
    DSV4_CHAT_EVENT_CONTENT   = 1,
    DSV4_CHAT_EVENT_TOOL_CALL = 2,
};

struct dsv4_chat_event {
    enum dsv4_chat_event_kind kind;
    const char               *text;      /* REASONING/CONTENT delta (not NUL-terminated) */
    size_t                    len;
    size_t                    index;     /* TOOL_CALL: 0-based position in the turn */
    const char               *name;      /* TOOL_CALL */
    const char               *arguments; /* TOOL_CALL: JSON text */
};

typedef void (*dsv4_chat_event_fn)(void *ud, const struct dsv4_chat_event *ev);

/* How a streamed turn ended. */
struct dsv4_chat_stream_end {
    bool   saw_eos;   /* the EOS text arrived (it is never reported as content) */
    bool   truncated; /* ended inside the reasoning or inside a tool-call block (or its opening) */
    size_t n_calls;   /* complete tool calls reported */
};

typedef struct dsv4_chat_stream dsv4_chat_stream;

int  dsv4_chat_stream_init(dsv4_chat_stream **out, enum dsv4_chat_mode mode, dsv4_chat_event_fn fn,
                           void *ud, struct dsv4_err *err);
/* DSV4_EFORMAT once the text cannot be a valid turn (malformed DSML, text after EOS);
 * the stream then stays failed. */
int  dsv4_chat_stream_feed(dsv4_chat_stream *s, const char *text, size_t len, struct dsv4_err *err);
/* Reports what is still held back and how the turn ended. */
int  dsv4_chat_stream_finish(dsv4_chat_stream *s, struct dsv4_chat_stream_end *end,
                             struct dsv4_err *err);
void dsv4_chat_stream_free(dsv4_chat_stream *s);

/*
 * Constrained decoding to JSON (src/tok/json_constraint.c). A dsv4_json_vocab is a byte trie
 * of a tokenizer's vocabulary, built once and shared by any number of threads. A
 * dsv4_constraint is one request's automaton: schema NULL accepts any JSON object, otherwise
 * the JSON texts of a JSON Schema subset (type object/array/string/number/integer/boolean/
 * null or [T, "null"], properties all required and in the schema's order, items, enum,
 * const). think_end >= 0: the output is free until that token (the reasoning of a thinking
 * turn). Given to the sampler (dsv4_sampler_params.constraint), it masks every token that
 * cannot continue a valid text, allows the EOS only once the text is complete, and
 * advances with each accepted token. Not thread-safe; mask and accept allocate nothing.
 */
typedef struct dsv4_json_vocab dsv4_json_vocab;
typedef struct dsv4_constraint dsv4_constraint;
int  dsv4_json_vocab_new(dsv4_json_vocab **out, const dsv4_tokenizer *tok, struct dsv4_err *err);
void dsv4_json_vocab_free(dsv4_json_vocab *v);
/* DSV4_EUNSUPPORTED names a schema keyword or form outside the subset; DSV4_EINVAL a bad one. */
int  dsv4_constraint_new_json(dsv4_constraint **out, const dsv4_json_vocab *v, const dsv4_tokenizer *tok,
                              const char *schema, size_t len, int32_t think_end, struct dsv4_err *err);
void dsv4_constraint_free(dsv4_constraint *c);
/* A thinking budget alone (no JSON): after budget reasoning tokens only think_end may come;
 * after think_end nothing is constrained. Or the budget set on any constraint. */
int  dsv4_constraint_new_think(dsv4_constraint **out, const dsv4_tokenizer *tok, int32_t think_end, int budget,
                               struct dsv4_err *err);
void dsv4_constraint_set_think_budget(dsv4_constraint *c, int budget);
/* A forced DSML tool call under strict schemas, from just after the forced opening's
 * `name="` (name NULL: any of the tools) or after `name="NAME">\n` (name given): tools is a
 * JSON array of {"name", "parameters"} (strict object schemas); the call is one invoke with
 * every parameter in the schema's order (plain strings as raw text, other values as JSON),
 * then the end of the block. */
int  dsv4_constraint_new_call(dsv4_constraint **out, const dsv4_json_vocab *v, const dsv4_tokenizer *tok,
                              const char *tools, size_t len, const char *name, struct dsv4_err *err);
/* Strict tools, unforced: the turn is free until the model opens a DSML tool-call block; from
 * there the block is constrained as above (several calls allowed). think_end as for JSON. */
int  dsv4_constraint_new_tools(dsv4_constraint **out, const dsv4_json_vocab *v, const dsv4_tokenizer *tok,
                               const char *tools, size_t len, int32_t think_end, struct dsv4_err *err);
/* A fresh constraint of the same schema (at its start), for another sequence. */
int  dsv4_constraint_clone(const dsv4_constraint *c, dsv4_constraint **out, struct dsv4_err *err);
/* Sets the logits of tokens that cannot come next to -inf. */
void dsv4_constraint_mask(dsv4_constraint *c, float *logits);
void dsv4_constraint_accept(dsv4_constraint *c, int32_t token);
/* The text so far is a complete value. */
bool dsv4_constraint_done(const dsv4_constraint *c);

/* ==================================================================================== */
/* End of tokenizer and chat format                                                     */
/* ==================================================================================== */

#ifdef __cplusplus
}
#endif
#endif /* DSV4_H */
