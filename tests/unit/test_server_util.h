/*
 * test_server_util.h - helpers of the server tests (test_server_util.c): a test
 * tokenizer.json, a `dsv4 serve` child process, HTTP requests returning parsed JSON, SSE
 * collection, a Prometheus text-format validator, canned tool-call responses.
 */
#ifndef DSV4_TEST_SERVER_UTIL_H
#define DSV4_TEST_SERVER_UTIL_H

#include <stdbool.h>
#include <sys/types.h>

#include <jansson.h>

#include "dsv4.h"
#include "test.h"

/* A DeepSeek-style tokenizer.json (byte-level BPE, ids 0/1 = BOS/EOS, the V4 chat and DSML
 * special tokens, merges of common letter pairs and triples) with exactly n_vocab ids. */
int tsrv_write_tokenizer(const char *dir, int n_vocab, struct dsv4_err *err);

struct tsrv {
    pid_t pid;      /* the child: dsv4, or mpirun */
    pid_t sig_pid;  /* where tsrv_stop's signal goes: dsv4, or MPI rank 0 under mpirun */
    int   port;
    int   out_fd; /* the child's stdout */
    char  log[512];
};

/* Starts `$DSV4_BIN serve -m dir --port 0 ARGS` and waits until it says "ready" (or
 * "standby" for --standby). */
bool tsrv_start(struct test_ctx *t, struct tsrv *s, const char *dir, const char *args);
/* The same under `mpirun -np ranks ... --ep ranks` (TCP on loopback, oversubscribed): the
 * signals of tsrv_stop go to rank 0, and the exit status is mpirun's. tsrv_start takes this
 * path when the runner was given --mpi N (test_mpi_ranks). */
bool tsrv_start_mpi(struct test_ctx *t, struct tsrv *s, const char *dir, const char *args, int ranks);
/* The pid of the child of mpirun `parent` that is MPI rank `rank` (its environment says so;
 * waits up to 5 s for it to appear), or -1. */
pid_t tsrv_mpi_rank_pid(pid_t parent, int rank);
/* Sends sig (0: none) and waits up to timeout_s for the exit; returns the exit status
 * (128 + signal when killed), -1 on timeout (then it is killed). */
int  tsrv_stop(struct tsrv *s, int sig, double timeout_s);

/* Requests: the status (-1 when the connection failed); *json the parsed body (or NULL). */
int tsrv_get(struct tsrv *s, const char *path, json_t **json, char **text);
int tsrv_get_h(struct tsrv *s, const char *path, const char *headers, json_t **json);
int tsrv_post(struct tsrv *s, const char *path, const char *body, const char *headers, json_t **json);
int tsrv_post_retry(struct tsrv *s, const char *path, const char *body, json_t **json, char *retry_after, size_t cap);
/* The body sent with Transfer-Encoding: chunked (no Content-Length). */
int tsrv_post_chunked(struct tsrv *s, const char *path, const char *body, const char *headers, json_t **json);
/* A loopback TCP connection to port (-1 on failure); sends all n bytes (false on failure). */
int  tsrv_connect(int port);
bool tsrv_send_all(int fd, const char *s, size_t n);
/* A tiny-a checkpoint (seed) with the test tokenizer in dir. */
bool tsrv_make_model(struct test_ctx *t, const char *dir, unsigned long long seed);
/* Connects and sends a request without reading anything; returns the socket (or -1). */
int tsrv_send_only(struct tsrv *s, const char *path, const char *body);

/* A streamed response, collected. */
struct tsrv_stream {
    json_t *chunks;     /* every data event but [DONE], parsed */
    char   *content;    /* the text: chat delta.content or completions text, joined */
    char   *reasoning;  /* chat delta.reasoning_content joined */
    json_t *usage;      /* the usage chunk's object, or NULL */
    char   *finish;     /* the last finish_reason */
    json_t *error;      /* an error event's object, or NULL */
    bool    done;       /* [DONE] arrived */
    bool    role_first; /* chat: the first chunk carries delta.role */
    int     comments;   /* ": ..." lines */
};
int  tsrv_stream(struct tsrv *s, const char *path, const char *body, const char *headers, struct tsrv_stream *out);
void tsrv_stream_free(struct tsrv_stream *st);

/* Checks Prometheus text exposition format 0.0.4; false with why. */
bool   tsrv_prom_validate(const char *text, char *why, size_t cap);
/* The value of the sample written exactly as `series` (name{labels}); NAN if absent. */
double tsrv_metric(const char *text, const char *series);
/* Polls /metrics until the series equals v (or timeout). */
bool   tsrv_wait_metric(struct tsrv *s, const char *series, double v, double timeout_s);
/* Polls /metrics until no request runs or waits in any tier. */
bool   tsrv_wait_idle(struct tsrv *s, double timeout_s);

/* Writes tool_whole.json, tool_stream.sse (OpenAI chat), messages_whole.json and
 * messages_stream.sse (Anthropic) into dir: srv_out's answers for a generated
 * turn with reasoning, content and two DSML tool calls (tokens from model_dir's
 * tokenizer.json), for the node client to parse. */
bool tsrv_write_canned(const char *dir, const char *model_dir);
/* Runs ids through srv_out as the server would (a chat in thinking mode that ends with
 * EOS): the SSE text or the whole body, malloc'd. */
char *tsrv_canned_output(const dsv4_tokenizer *tok, const int32_t *ids, int n, bool stream, int tokens_per_event);
/* The same for an API kind (enum srv_api_kind: SRV_API_CHAT or SRV_API_MESSAGES). */
char *tsrv_canned_output_kind(const dsv4_tokenizer *tok, const int32_t *ids, int n, int kind, bool stream,
                              int tokens_per_event);
/* The same with a forced tool call's opening (request_chat.c) before ids, in chat mode. */
char *tsrv_canned_output_forced(const dsv4_tokenizer *tok, const int32_t *ids, int n, int kind, bool stream,
                                const char *forced);
/* The general form: tokens_per_event per srv_out_tokens call, ended with finish (enum
 * srv_finish). */
char *tsrv_canned_run(const dsv4_tokenizer *tok, const int32_t *ids, int n, int kind, bool stream, int tokens_per_event,
                      const char *forced, int finish);
/* The generated text of the canned turn: reasoning, content and two DSML tool calls. */
char *tsrv_canned_turn(void);

/* Weight-free tests of test_server_out.c, run in the server group. */
void tsrv_test_out_tool_calls(struct test_ctx *t);
void tsrv_test_out_stop_strings(struct test_ctx *t);
void tsrv_test_out_no_markup(struct test_ctx *t);
void tsrv_test_job_ring(struct test_ctx *t);
void tsrv_test_prom_validator(struct test_ctx *t);
/* Every engine option of `dsv4 serve --help` reaches the engine (test_server_options.c). */
void tsrv_test_engine_options(struct test_ctx *t, const char *model_dir);
/* Every command that opens a model takes the engine options (test_server_options.c). */
void tsrv_test_model_commands_options(struct test_ctx *t, const char *model_dir);

#endif
