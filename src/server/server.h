/*
 * server.h - the internals of `dsv4 serve` (src/server/), shared by its files, the front end
 * (tools/cmd_serve.c) and the tests. The server code itself uses only the public API of
 * include/dsv4.h: it never sees tensors, KV layouts or backend ops.
 *
 * Threads and ownership:
 *   - libmicrohttpd runs one thread per connection (http.c). A connection thread parses and
 *     validates its request (api.c and the request's dialect), renders and tokenizes the
 *     prompt, submits a job, then turns the job's token events into the HTTP response
 *     (api_output.c).
 *   - One inference worker thread (worker.c) owns the engine and the scheduler of
 *     src/sched/ (continuous batching, paged KV, prefix cache, bounded queue), and so all
 *     model state. It loads the model, steps the scheduler, and pushes one event per
 *     generated token into each job.
 *   - struct srv_job is the only object both sides touch; its fields say which lock guards
 *     them. Metrics (metrics.c) have their own lock.
 *
 * Generation jobs go through the narrow worker interface below (submit, cancel, stats), so
 * HTTP and API code know nothing of the scheduler.
 */
#ifndef DSV4_SERVER_H
#define DSV4_SERVER_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsv4.h"

typedef struct json_t json_t; /* jansson's, for the declarations below */

/* ==================================================================================== */
/* Parameters and the server object (http.c)                                            */
/* ==================================================================================== */

enum {
    SRV_MAX_TOP_LOGPROBS = 20,  /* OpenAI's limit for top_logprobs */
    SRV_MAX_STOP         = 8,   /* stop strings per request */
    SRV_MAX_STOP_LEN     = 256, /* bytes per stop string */
    SRV_N_TIERS          = 3,   /* prompt length tiers: short, medium, long (as the scheduler) */
    SRV_MAX_N            = 16,  /* choices per request ("n") */
};

struct srv_params {
    const char *model_dir;
    const char *model_name;      /* served name; NULL = the directory's base name */
    const char *host;            /* numeric address or name to bind; default 127.0.0.1 */
    int         port;            /* 0 = any free port (srv_port tells which) */
    const char *api_key;         /* NULL = no authentication */
    bool        standby;         /* hot standby: load, warm, answer 503 "standby" until srv_promote */
    bool        lazy_weights;    /* do not read and map the weights before READY (they fault in on use) */
    int         max_seqs;        /* sequences generated at once (KV slots) */
    int         ctx;             /* tokens per sequence, prompt + completion */
    int         max_queue;       /* accepted requests waiting for a sequence; more get 429 */
    int         max_batch_tokens;   /* token rows per step, 0 = the scheduler's default */
    int         max_prefill_tokens; /* prefill rows per step while decoding, -1 = default, 0 = no bound */
    float       prefill_share;   /* prefill time next to decode, share of a decode step; < 0 = default, 0 = off */
    int         kv_pages;        /* KV pages, 0 = enough for every sequence at full context */
    int         prefix_entries;  /* prefix-cache entries, -2 = default, 0 = off */
    int         keep_finished;   /* finished sequences kept for the next turn (-1 = max_seqs, 0 = off) */
    const char *kv_disk_dir;     /* the prefix cache's disk tier, NULL = off */
    uint64_t    kv_disk_budget;  /* its bytes, 0 = the scheduler's default */
    int         spec_draft;      /* speculative decoding: most MTP drafts per step, -1 = default
                                    (DSV4_SPEC_DRAFT_DEFAULT with an MTP block), 0 = off */
    int         tier_tokens[2];  /* prompts up to [0] tokens are short, up to [1] medium */
    size_t      mem_limit;       /* bytes the KV plan may take, 0 = from the free memory */
    /* The engine's options, carried whole to the worker's dsv4_engine_open (its log: the
     * server's log below when NULL). */
    struct dsv4_engine_params engine;
    int         max_conns;       /* open HTTP connections (plus SRV_PROBE_CONNS for probes) */
    int         max_conns_per_ip; /* open connections from one client address, 0 = no bound */
    int         idle_timeout_s;  /* close a connection idle (or stalled) this long */
    double      request_timeout_s; /* a whole request (headers and body) must arrive within this */
    const char *cors_origin;     /* Access-Control-Allow-Origin of the API paths, NULL = no CORS */
    bool        no_webui;        /* no chat page at / (then a 404 like any unknown path) */
    bool        special_in_messages; /* special-token text in chat messages is a control token */
    size_t      max_body;        /* request body bytes; more gets 413 */
    int         max_json_depth;  /* nesting of [ and {; deeper gets 400 */
    double      keepalive_s;     /* SSE comment after this long without output */
    int         stream_buffer;   /* token events a stream may have unsent before it is cut */
    int         send_buffer;     /* kernel send buffer per connection (SO_SNDBUF), bytes */
    int         default_max_tokens_completions; /* /v1/completions without max_tokens */
    int         responses_store;    /* /v1/responses kept for previous_response_id (newest first out last) */
    int         responses_store_mb; /* and at most this many MiB of their conversations' JSON */
    dsv4_log_fn log;
    void       *log_ud;
};

void srv_params_default(struct srv_params *p);

/* The chat page served at / (src/server/webui/chat.html, embedded at build time by
 * tools/file_embed.sh into the generated build/gen/webui_chat.c): its bytes, NUL-terminated,
 * and its length without the NUL. */
extern const unsigned char srv_webui_chat_html[];
extern const size_t        srv_webui_chat_html_len;

/* Connections accepted past max_conns, for /health and /metrics only. */
enum { SRV_PROBE_CONNS = 4 };

enum srv_state {
    SRV_STATE_LOADING  = 0,
    SRV_STATE_READY    = 1,
    SRV_STATE_DRAINING = 2,
    SRV_STATE_FAILED   = 3,
    SRV_STATE_STANDBY  = 4, /* loaded and warm, not serving until promoted (--standby) */
    SRV_STATE_COUNT
};

/* The state's name in /health's status and dsv4_server_state's label ("ok" for READY in
 * /health, "ready" in the metric). */
const char *srv_state_name(enum srv_state st);

struct srv;

/* Binds the listening socket and starts the HTTP threads and the worker, which loads the
 * model in the background (/health answers 503 until it is ready). */
int  srv_start(struct srv **out, const struct srv_params *p, struct dsv4_err *err);
int  srv_port(const struct srv *s);
enum srv_state srv_get_state(struct srv *s, struct dsv4_err *load_err);
/* Stops accepting connections; requests already accepted run on, new ones on open
 * connections get 503. */
void srv_drain(struct srv *s);
/* Ends the standby: the server serves as soon as it is ready (at once if it is). Returns
 * false when it was not in standby (nothing changes). */
bool srv_promote(struct srv *s);
/* Requests accepted and not yet answered in full. */
int  srv_in_flight(struct srv *s);
/* Cancels whatever still runs, stops every thread, frees everything. */
void srv_stop(struct srv *s);

/* ==================================================================================== */
/* Jobs (job.c): one generation request, shared by a connection thread and the worker   */
/* ==================================================================================== */

enum srv_finish {
    SRV_FINISH_NONE = 0,  /* still running */
    SRV_FINISH_EOS,       /* the model ended its turn */
    SRV_FINISH_LENGTH,    /* max_tokens or the context reached */
    SRV_FINISH_CANCELLED, /* the consumer asked (stop string, disconnect, shutdown) */
    SRV_FINISH_SLOW,      /* the consumer fell stream_buffer events behind */
    SRV_FINISH_ERROR,     /* the engine failed; msg says why */
};

/* One generated token; the log-probabilities only when the job asked for them. */
struct srv_token {
    int32_t id;
    int     n_top;                          /* entries of top_* */
    float   logprob;                        /* log p(id) under the model's distribution */
    int32_t top_id[SRV_MAX_TOP_LOGPROBS];
    float   top_lp[SRV_MAX_TOP_LOGPROBS];
};

struct srv_job {
    /* Set by the connection thread before srv_worker_submit; read-only afterwards. */
    int32_t                   *prompt;      /* [n_prompt] */
    int                        n_prompt;
    int                        max_tokens;  /* tokens to generate at most */
    struct dsv4_sampler_params sp;
    bool                       logprobs;    /* fill logprob (and n_top = top_logprobs) */
    int                        top_logprobs;
    bool                       ignore_eos;  /* EOS is an ordinary token (benchmarks) */
    int                        spec_draft;  /* "speculative": {"draft": K}: 0 = the server's, -1 = off */
    dsv4_constraint           *constraint;  /* constrained output (owned; freed with the job), or NULL */        /* 0 short, 1 long */
    double                     t_submit;    /* srv_now() when submitted */

    /* Set by srv_worker_submit. */
    int                        tier;        /* 0 short, 1 medium, 2 long */
    struct srv_worker         *worker;

    /* The consumer asked to stop. */
    atomic_bool cancel;
    /* Worker thread only. */
    bool        slow;        /* cancelled because the ring was full */
    double      t_last;      /* when the last token was pushed */

    pthread_mutex_t mu;
    pthread_cond_t  cv;          /* signalled on every push and on finish */
    /* Protected by mu: a ring of events not yet taken by the consumer. */
    struct srv_token *ring;      /* [ring_cap] */
    int               ring_cap;
    int               ring_head; /* index of the oldest untaken event */
    int               ring_len;
    /* Protected by mu, written by the worker. */
    int               n_generated; /* tokens pushed so far */
    int               n_cached;    /* prompt tokens found in the prefix cache */
    uint64_t          sched_id;    /* the scheduler's id (0 before submission) */
    enum srv_finish   finish;      /* != NONE once the worker is done with the job */
    char              msg[256];    /* why, for SRV_FINISH_ERROR */
    /* Protected by mu: references (connection side, response, worker). */
    int               refs;
    /* Protected by the worker's mu: its list of live jobs. */
    struct srv_job   *prev, *next;
};

/* A job for a prompt (copied); NULL when out of memory. One reference, the caller's. */
struct srv_job *srv_job_new(const int32_t *prompt, int n_prompt, int max_tokens, int ring_cap);
void            srv_job_ref(struct srv_job *j);
void            srv_job_unref(struct srv_job *j);
/* Worker side: appends an event; false when the ring is full (the consumer is too slow). */
bool            srv_job_push(struct srv_job *j, const struct srv_token *t);
/* Worker side: marks the job done (once) and wakes the consumer. */
void            srv_job_finish(struct srv_job *j, enum srv_finish f, const char *msg);
/* Consumer side: waits up to timeout_s for events or the finish, then moves up to cap
 * events into out. Returns the number taken; *finish is the job's state after taking. */
int             srv_job_take(struct srv_job *j, struct srv_token *out, int cap, double timeout_s,
                             enum srv_finish *finish, int *n_cached);

/* ==================================================================================== */
/* The inference worker (worker.c)                                                      */
/* ==================================================================================== */

struct srv_metrics;

struct srv_worker_params {
    const char         *model_dir;
    int                 max_seqs, ctx, max_queue;
    struct dsv4_engine_params engine; /* srv_params.engine, as given */
    int                 max_batch_tokens, max_prefill_tokens, kv_pages, prefix_entries, tier_tokens[2];
    int                 keep_finished;
    const char         *kv_disk_dir;
    uint64_t            kv_disk_budget;
    int                 spec_draft; /* -1: the default for the model */
    float               prefill_share;
    size_t              mem_limit;
    bool                map_weights; /* after loading: every weight page read and mapped before READY */
    bool                warm;        /* then one warm-up request (the standby) */
    struct srv_metrics *metrics;
    dsv4_log_fn        log;
    void              *log_ud;
};

/* What the worker reports for /metrics and /health. */
struct srv_worker_stats {
    enum srv_state            state;
    int                       running[SRV_N_TIERS];
    int                       waiting[SRV_N_TIERS];
    int                       max_seqs, ctx, max_queue, page_tokens;
    struct dsv4_sched_metrics sched; /* as of the last step */
    bool                        has_engine; /* the model is loaded: engine is set */
    struct dsv4_engine_settings engine;     /* the options it runs with */
};

struct srv_worker;

/* Starts the worker thread; it opens the engine and tokenizer, plans and creates the
 * scheduler, then serves jobs. */
int  srv_worker_start(struct srv_worker **out, const struct srv_worker_params *p, struct dsv4_err *err);
/* The checks srv_worker_start makes of p (shared with the fuzzers' stub worker; job.c). */
int  srv_worker_params_check(const struct srv_worker_params *p, struct dsv4_err *err);
/* LOADING, READY or FAILED (err then holds why). */
enum srv_state srv_worker_state(struct srv_worker *w, struct dsv4_err *err);
/* After READY: the tokenizer (NULL if the model has none), the model and the tokens per
 * sequence. Immutable. */
const dsv4_tokenizer *srv_worker_tokenizer(struct srv_worker *w);
void srv_worker_info(struct srv_worker *w, struct dsv4_model_info *info, int *ctx);
/* The length tier of a prompt. */
int  srv_worker_tier(const struct srv_worker *w, int n_prompt);
/* Queues a job (takes a reference). DSV4_EFULL when the queue is full, DSV4_ERANGE when
 * it cannot fit a sequence or the KV pool, DSV4_ECANCELED when not ready. */
int  srv_worker_submit(struct srv_worker *w, struct srv_job *j, struct dsv4_err *err);
/* Asks the worker to stop a job (queued or running); the job then finishes CANCELLED. */
void srv_worker_cancel(struct srv_worker *w, struct srv_job *j);
/* Cancels every job, queued and running. */
void srv_worker_cancel_all(struct srv_worker *w);
void srv_worker_stats(struct srv_worker *w, struct srv_worker_stats *st);
void srv_worker_stop(struct srv_worker *w);

/* ==================================================================================== */
/* Metrics (metrics.c): Prometheus text exposition                                      */
/* ==================================================================================== */

enum srv_endpoint {
    SRV_EP_CHAT = 0,
    SRV_EP_COMPLETIONS,
    SRV_EP_MODELS,
    SRV_EP_MESSAGES,       /* Anthropic: POST /v1/messages */
    SRV_EP_COUNT_TOKENS,   /* Anthropic: POST /v1/messages/count_tokens */
    SRV_EP_RESPONSES,      /* OpenAI Responses: POST /v1/responses */
    SRV_EP_HEALTH,
    SRV_EP_METRICS,
    SRV_EP_PROMOTE,        /* POST /admin/promote (--standby with --api-key) */
    SRV_EP_WEBUI,          /* the chat page: GET / (http.c, unless --no-webui) */
    SRV_EP_OTHER,
    SRV_EP_COUNT,
};

enum srv_hist {
    SRV_H_TTFT = 0,   /* seconds from submission to the first token */
    SRV_H_ITL,        /* seconds between two tokens of one request */
    SRV_H_E2E,        /* seconds from submission to the last token */
    SRV_H_STEP,       /* seconds per forward call of the worker */
    SRV_H_BATCH,      /* tokens per forward call */
    SRV_H_QUEUE,      /* seconds from submission to admission */
    SRV_H_COUNT,
};

enum srv_counter {
    SRV_C_PROMPT_TOKENS = 0,
    SRV_C_CACHED_TOKENS,
    SRV_C_GEN_TOKENS,
    SRV_C_FINISH_STOP,       /* requests by finish reason: EOS or a stop string */
    SRV_C_FINISH_LENGTH,
    SRV_C_FINISH_TOOL_CALLS,
    SRV_C_FINISH_CANCELLED,  /* the client went away, or shutdown */
    SRV_C_FINISH_SLOW,       /* the client read too slowly */
    SRV_C_FINISH_ERROR,
    SRV_C_FINISH_SHUTDOWN,   /* cut by srv_stop past the drain deadline */
    SRV_C_PREEMPTIONS,
    SRV_C_HTTP_REQUEST_TIMEOUT, /* connections closed at the request deadline (slow senders) */
    SRV_C_COUNT,
};

struct srv_metrics *srv_metrics_new(void);
void srv_metrics_free(struct srv_metrics *m);
void srv_metrics_request(struct srv_metrics *m, enum srv_endpoint ep, int status);
void srv_metrics_observe(struct srv_metrics *m, enum srv_hist h, double v);
void srv_metrics_add(struct srv_metrics *m, enum srv_counter c, long n);
void srv_metrics_connections(struct srv_metrics *m, int delta);
/* The whole exposition (malloc'd, NUL-terminated). */
char *srv_metrics_render(struct srv_metrics *m, const struct srv_worker_stats *ws, const char *model, size_t *len);

/* ==================================================================================== */
/* The API side: requests (api.c and the dialects) and answers (api_output.c); api.h    */
/* holds what only its files share                                                      */
/* ==================================================================================== */

enum srv_api_kind {
    SRV_API_CHAT = 0,       /* OpenAI /v1/chat/completions */
    SRV_API_COMPLETION = 1, /* OpenAI /v1/completions */
    SRV_API_MESSAGES = 2,   /* Anthropic /v1/messages (api_anthropic.c) */
    SRV_API_COUNT = 3,      /* Anthropic /v1/messages/count_tokens: the prompt only */
    SRV_API_RESPONSES = 4,  /* OpenAI /v1/responses (api_responses.c) */
};

/* An HTTP error: OpenAI's shape {"error": {message, type, param, code}}, or Anthropic's
 * {"type": "error", "error": {type, message}} on the Anthropic paths. */
struct srv_api_error {
    int         status;
    const char *type;
    const char *code;  /* NULL = null */
    const char *param; /* NULL = null; static text or param_buf (never the request's JSON) */
    char        param_buf[128];
    char        msg[DSV4_ERR_MSG_MAX];
};

/* Fills e and returns -1 (so parsers can `return srv_api_fail(...)`). */
int srv_api_fail(struct srv_api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The error as a JSON body (malloc'd). */
char *srv_api_error_json(const struct srv_api_error *e, size_t *len);
/* The same in Anthropic's shape (api_anthropic.c). */
char *srv_anth_error_json(const struct srv_api_error *e, size_t *len);

struct srv_resp_store;
struct srv_turns;

/* What the server knows when it parses a request. */
struct srv_api_ctx {
    struct srv_resp_store *responses; /* /v1/responses' store (NULL: none) */
    struct srv_turns      *turns;     /* recent chat turns' tokens (turns.c; NULL: none) */
    const dsv4_json_vocab *json_vocab; /* for constrained output (NULL: not available) */
    const char           *model_name;
    const dsv4_tokenizer *tok;       /* NULL: token ids only */
    int                   vocab;
    int                   ctx;       /* tokens per sequence */
    int                   max_pos;   /* the model's max_position_embeddings (0: ctx) */
    int                   default_max_tokens_completions;
    int                   max_json_depth;
    bool                  special_in_messages; /* trusted callers: message text may hold control tokens */
};

/* A validated generation request. */
struct srv_gen {
    enum srv_api_kind          kind;
    int32_t                   *prompt;      /* [n_prompt], malloc'd */
    int                        n_prompt;
    int                        max_tokens;
    int                        n;            /* choices (chat and completions; 1 elsewhere) */
    struct dsv4_sampler_params sp;
    bool                       stream;
    bool                       include_usage;
    bool                       logprobs;
    int                        top_logprobs; /* chat: top_logprobs; completions: logprobs */
    bool                       ids_as_text;  /* return_tokens_as_token_ids */
    bool                       ignore_eos;   /* vLLM's ignore_eos: generate max_tokens */
    bool                       token_ids;    /* completions: add "token_ids" to choices */
    bool                       parse_chat;   /* run the DSML parser on the output */
    bool                       keep_special; /* skip_special_tokens: false: control tokens as text */
    int                        spec_draft;   /* "speculative": {"draft": K}, as struct srv_job */
    enum dsv4_chat_mode        mode;
    bool                       tools;        /* tools were offered */
    json_t                    *conv;         /* responses: the conversation without instructions (owned) */
    json_t                    *echo;         /* responses: request fields echoed in the response (owned) */
    bool                       store;        /* responses: keep the conversation for previous_response_id */
    dsv4_constraint           *constraint;   /* response_format / text.format: the output's automaton (owned) */
    char                      *forced;       /* malloc'd: the call opening a forced tool choice appended to
                                                the prompt (request_chat.c), or NULL */
    int                        n_stop;
    char                       stop[SRV_MAX_STOP][SRV_MAX_STOP_LEN + 1];
    char                       id[40];       /* "chatcmpl-..." / "cmpl-..." / "msg_..." */
    long long                  created;
};

/* A random id: prefix + 24 hex digits. */
void srv_api_make_id(char *out, size_t cap, const char *prefix);
uint64_t srv_random_u64(void);

/* Parses and validates a body (bytes) for kind with its dialect; renders and tokenizes the
 * prompt. On failure returns -1 with e filled (status 400 or 413, a sentence naming the
 * field). The limit on generated tokens follows one rule in every dialect (request.c). */
int  srv_api_parse(const struct srv_api_ctx *c, enum srv_api_kind kind, const char *body, size_t len,
                   struct srv_gen *g, struct srv_api_error *e);
void srv_gen_free(struct srv_gen *g);
/* Deepest nesting of arrays and objects in a JSON text (strings skipped). */
int  srv_json_depth(const char *s, size_t n);
/* GET /v1/models body (malloc'd); one: the model object alone (GET /v1/models/ID). */
char *srv_api_models_json(const char *model_name, long long created, int ctx, bool one, size_t *len);

/* A growable byte buffer (strbuf.c). */
struct srv_buf {
    char  *p;
    size_t len, cap;
    bool   oom;
};
void srv_buf_put(struct srv_buf *b, const void *s, size_t n);
void srv_buf_puts(struct srv_buf *b, const char *s);
void srv_buf_printf(struct srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_free(struct srv_buf *b);

/* The output side of one request: consumes token events, applies stop strings, the
 * streaming detokenizer and the DSML parser, and writes SSE chunks (streaming) or keeps
 * what the final JSON needs. */
struct srv_out;

struct srv_out *srv_out_new(const struct srv_gen *g, const struct srv_api_ctx *c);
void srv_out_free(struct srv_out *o);
/* Streaming: the opening chunk (role for chat). */
void srv_out_begin(struct srv_out *o, struct srv_buf *sse);
/* Feeds tokens; streaming output goes to sse. Returns true once a stop string matched (the
 * caller then cancels the job; later tokens are ignored). */
bool srv_out_tokens(struct srv_out *o, const struct srv_token *t, int n, struct srv_buf *sse);
/* Ends the response: streaming writes the last chunks and [DONE] to sse; otherwise the
 * whole JSON body (the completion, or an error) goes to body. msg explains
 * SRV_FINISH_ERROR/SLOW. Returns the HTTP status of a whole body (200 when streaming) and
 * sets *counted to the finish-reason counter. */
int  srv_out_end(struct srv_out *o, enum srv_finish f, int n_cached, const char *msg, struct srv_buf *sse,
                 struct srv_buf *body, enum srv_counter *counted);
/* Tokens consumed (the completion's usage), and whether a stop string ended it. */
int  srv_out_n_tokens(const struct srv_out *o);
/* Choice index of n (n > 1: several outputs make one response; chat and completions). */
void srv_out_set_choice(struct srv_out *o, int index, int n);
/* Ends the outputs whose jobs finished (fin[i] != NONE) and that are not ended yet
 * (ended[i] is then set; counted[i] gets the finish counter, SRV_C_COUNT for the others).
 * Streaming (sse): each one's last chunks, then, once every one ended, the usage chunk and
 * [DONE] once. Whole (body, all finished): one body with every choice, usage summed.
 * Returns the HTTP status of the whole body (200 when streaming). */
int  srv_out_end_all(struct srv_out **outs, struct srv_job **jobs, const enum srv_finish *fin, bool *ended, int n,
                     int n_cached, struct srv_buf *sse, struct srv_buf *body, enum srv_counter *counted);

/* The Responses API's store (resp_store.c): the newest conversations, at most cap of them
 * and max_bytes of JSON in all; thread-safe. */
struct srv_resp_store *srv_resp_store_new(int cap, size_t max_bytes);
void                   srv_resp_store_free(struct srv_resp_store *s);
/* Stores conv (consumed) and the response object under id. */
void                   srv_resp_store_put(struct srv_resp_store *s, const char *id, json_t *conv, json_t *response);
/* A copy of the conversation stored under id, or NULL. */
json_t                *srv_resp_store_get(struct srv_resp_store *s, const char *id);
/* GET /v1/responses/{id}: the stored response object (malloc'd JSON), or NULL; DELETE:
 * whether there was one. */
char                  *srv_resp_store_response(struct srv_resp_store *s, const char *id);
bool                   srv_resp_store_delete(struct srv_resp_store *s, const char *id);

/* Recent finished chat turns' token ids (turns.c): a later prompt whose text begins with a
 * stored turn's text is given that turn's tokens for it, so it continues the sequence the
 * prefix cache holds. Thread-safe. */
struct srv_turns *srv_turns_new(void);
void              srv_turns_free(struct srv_turns *s);
void              srv_turns_put(struct srv_turns *s, const dsv4_tokenizer *tok, const int32_t *prompt, int n_prompt,
                                const int32_t *gen, int n_gen);
/* Rewrites *prompt (malloc'd) when a stored turn matches; the result has at most max_n
 * tokens. Returns the stored tokens put in (0: unchanged). */
int               srv_turns_splice(struct srv_turns *s, const dsv4_tokenizer *tok, int32_t **prompt, int *n_prompt,
                                   int max_n);

/* Length of the valid UTF-8 sequence at s (1 to 4), or 0 if the byte starts none. */
size_t  srv_utf8_seq(const unsigned char *s, size_t n);
/* A JSON string of s[0..n), invalid UTF-8 bytes replaced by U+FFFD (strbuf.c). */
json_t *srv_json_str(const char *s, size_t n);

/* ==================================================================================== */
/* Small shared helpers (job.c)                                                         */
/* ==================================================================================== */

/* Monotonic seconds. */
double srv_now(void);

static inline int srv_err(struct dsv4_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int srv_err(struct dsv4_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void srv_log(dsv4_log_fn fn, void *ud, enum dsv4_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* DSV4_SERVER_H */
