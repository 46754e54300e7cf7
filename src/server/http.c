/*
 * http.c - the HTTP side of `dsv4 serve` on libmicrohttpd: listening, routing, limits,
 * authentication, server-sent events, client disconnects, drain.
 *
 * Threading: libmicrohttpd runs one thread per connection, so a connection thread may
 * block while its request runs (a whole-body answer waits for the job; a stream's content
 * callback waits for the next token). Waits are sliced into short timeouts; between
 * slices the thread checks whether the client has gone (poll for RDHUP/HUP on the socket)
 * and cancels the job if so, and a stream writes an SSE comment after keepalive_s without
 * output (long queues and prefills). The inference worker never waits on a connection.
 *
 * Limits: bodies above max_body get 413 as soon as Content-Length says so (before the
 * upload) or when the upload crosses it; JSON nesting above max_json_depth gets 400;
 * headers are bounded by libmicrohttpd's per-connection memory (64 KiB, else 431); open
 * connections by max_conns and, per client address, by max_conns_per_ip (libmicrohttpd's
 * own limit); a connection idle or stalled for idle_timeout_s is closed, which cancels its
 * job.
 *
 * Deadlines: the idle timeout only sees silence, so a client sending one byte a second
 * would hold its connection for ever. Every connection therefore has a request deadline:
 * its next request (headers and body) must have arrived request_timeout_s after the
 * connection opened or its previous response ended (an idle keep-alive connection is closed
 * then too). The watchdog thread shuts down the socket of a connection past its deadline
 * (libmicrohttpd then closes it) and counts it. Connections past max_conns are still
 * accepted, up to SRV_PROBE_CONNS more, but serve only /health and /metrics with a short
 * deadline, so a load balancer's probes answer while the pool is full. Each connection's kernel send buffer is fixed at send_buffer bytes
 * (no auto-tuning), so a client that stops reading soon blocks its writes; its tokens then
 * pile up in the job's ring, and past stream_buffer of them the worker cuts the request (it
 * ends with an error event).
 *
 * The chat page: GET / answers the page embedded at build time (webui_page; --no-webui turns
 * it off), with a Content-Security-Policy that keeps it to this server.
 *
 * Drain: srv_drain closes the listening socket (libmicrohttpd "quiesce"), /health turns
 * 503, requests arriving on open connections get 503; accepted requests run to the end.
 * srv_in_flight counts those; the front end stops the server when it reaches 0 or the
 * deadline passes. srv_stop cancels what is still running and waits (briefly) until each
 * of those requests has been answered: a stream with an error event in OpenAI's shape and
 * [DONE], a whole-body request with a 503; only then are the connections closed.
 *
 * Standby (--standby): the worker loads and warms the model as usual, but while s->standby
 * is set the state reads STANDBY: /health answers 503 "standby" (readiness fails, so no
 * traffic is routed here) and the API 503. srv_promote clears it: SIGUSR1 (the front end)
 * or POST /admin/promote, which needs the API key and is refused on a server without one,
 * so that nobody who can merely reach the port can put a replica into service.
 *
 * Locks: s->mu guards draining, standby, in_flight and the connection list (struct conn);
 * everything else in struct srv is set before the daemon starts and read-only afterwards.
 * A struct req belongs to its connection thread; a struct stream to its response (same
 * thread).
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "server/server.h"

/* One open connection (libmicrohttpd's socket context), in the list s->conns. */
struct conn {
    struct conn *prev, *next; /* protected by s->mu, as are the fields below */
    int          fd;
    double       deadline;    /* its next request must have arrived by then; 0 while answering */
    bool         probe_only;  /* admitted past max_conns: /health and /metrics only */
};

struct srv {
    struct srv_params   p;
    char                model_name[256];
    struct MHD_Daemon  *d;
    int                 port;
    struct srv_worker  *w;
    struct srv_metrics *m;
    struct srv_resp_store *responses; /* /v1/responses' previous_response_id store */
    struct srv_turns      *turns;     /* recent chat turns' tokens (turns.c) */
    dsv4_json_vocab       *json_vocab; /* constrained output's vocabulary trie, built on first use (mu) */
    bool                   json_vocab_tried;
    long long           created;
    pthread_t           watchdog;
    bool                watchdog_started;

    pthread_mutex_t mu;
    /* Protected by mu. */
    bool         draining;
    bool         standby;   /* not promoted yet (--standby) */
    bool         stopping;  /* the watchdog ends */
    int          in_flight; /* generation requests accepted and not yet answered in full */
    struct conn *conns;     /* open connections */
    int          n_general; /* those not probe_only */
};

struct req {
    struct srv       *s;
    struct conn      *conn;
    enum srv_endpoint ep;
    char              model_id[256]; /* GET /v1/models/ID: the id ("" for the list) */
    struct srv_buf    body;
    bool              too_large;
    bool              in_flight; /* counted in s->in_flight */
    struct srv_job   *jobs[SRV_MAX_N]; /* our references, while a generation runs (one per choice) */
    int               n_jobs;
    bool              replied;
};

/* State of one SSE response, owned by the response object. */
struct stream {
    struct srv     *s;
    int             n;                    /* choices (n > 1: one job each) */
    struct srv_job *jobs[SRV_MAX_N];
    struct srv_out *outs[SRV_MAX_N];
    bool            done[SRV_MAX_N];      /* the job finished */
    enum srv_finish fin[SRV_MAX_N];       /* how */
    bool            ended_out[SRV_MAX_N]; /* its output was ended */
    int             n_done, n_cached;
    struct srv_buf  sse;
    size_t          sent;
    int             fd;
    bool            ended;
    bool            cut; /* the client went away */
    double          last_write;
};

void srv_params_default(struct srv_params *p)
{
    memset(p, 0, sizeof(*p));
    dsv4_engine_params_default(&p->engine);
    p->host                           = "127.0.0.1";
    p->port                           = 8000;
    p->max_seqs                       = 8;
    p->ctx                            = 4096;
    p->max_queue                      = 64;
    p->max_prefill_tokens             = -1;
    p->prefill_share                  = -1;
    p->prefix_entries                 = -2;
    p->keep_finished                  = -1;
    p->spec_draft                     = -1;
    p->tier_tokens[0]                 = 512;
    p->tier_tokens[1]                 = 4096;
    p->max_conns                      = 256;
    p->max_conns_per_ip               = 64;
    p->idle_timeout_s                 = 60;
    p->request_timeout_s              = 30;
    p->max_body                       = 4u << 20;
    p->max_json_depth                 = 64;
    p->keepalive_s                    = 5.0;
    p->stream_buffer                  = 4096;
    p->send_buffer                    = 64 * 1024;
    p->default_max_tokens_completions = 16;
    p->responses_store                = 256;
    p->responses_store_mb             = 64;
}

/* ------------------------------------------------------------------ responses */

/* The methods each endpoint takes (the Allow header of a 405). */
static const char *allowed_methods(const struct srv *s, enum srv_endpoint ep)
{
    bool cors = s->p.cors_origin != NULL;
    switch (ep) {
    case SRV_EP_CHAT:
    case SRV_EP_COMPLETIONS:
    case SRV_EP_MESSAGES:
    case SRV_EP_COUNT_TOKENS: return cors ? "POST, OPTIONS" : "POST";
    case SRV_EP_RESPONSES: return cors ? "GET, POST, DELETE, OPTIONS" : "GET, POST, DELETE";
    case SRV_EP_MODELS: return cors ? "GET, HEAD, OPTIONS" : "GET, HEAD";
    case SRV_EP_HEALTH:
    case SRV_EP_METRICS:
    case SRV_EP_WEBUI: return "GET, HEAD";
    case SRV_EP_PROMOTE: return "POST";
    default: return NULL;
    }
}

static bool is_api(enum srv_endpoint ep)
{
    return ep == SRV_EP_CHAT || ep == SRV_EP_COMPLETIONS || ep == SRV_EP_MODELS || ep == SRV_EP_MESSAGES ||
           ep == SRV_EP_COUNT_TOKENS || ep == SRV_EP_RESPONSES;
}

/* The Anthropic paths answer errors in Anthropic's shape. */
static bool is_anthropic(enum srv_endpoint ep)
{
    return ep == SRV_EP_MESSAGES || ep == SRV_EP_COUNT_TOKENS;
}

/* CORS on the API paths when --cors-origin is set (probes and metrics are not for browsers). */
static void add_cors(const struct srv *s, struct MHD_Response *resp, enum srv_endpoint ep)
{
    if (!s->p.cors_origin || !is_api(ep)) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", s->p.cors_origin);
    if (strcmp(s->p.cors_origin, "*") != 0) MHD_add_response_header(resp, "Vary", "Origin");
}

/* Tells keep-alive clients how long an idle connection stays open (the request deadline, or
 * the idle timeout if shorter), a second early, so that a pooled connection is not reused
 * just as the server closes it. */
static void add_keep_alive(const struct srv *s, struct MHD_Response *resp)
{
    double t = s->p.request_timeout_s < s->p.idle_timeout_s ? s->p.request_timeout_s : s->p.idle_timeout_s;
    char   v[32];
    snprintf(v, sizeof(v), "timeout=%d", t > 2 ? (int)t - 1 : 1);
    MHD_add_response_header(resp, "Keep-Alive", v);
}

/* Draining servers and probe connections close the connection after the response; others
 * say how long it stays open. */
static void add_connection(struct srv *s, const struct req *r, struct MHD_Response *resp)
{
    pthread_mutex_lock(&s->mu);
    bool draining = s->draining;
    bool probe    = r->conn && r->conn->probe_only;
    pthread_mutex_unlock(&s->mu);
    if (draining || probe) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    else add_keep_alive(s, resp);
}

/* Queues resp with status, counts it, and marks the request answered. */
static enum MHD_Result queue(struct srv *s, struct MHD_Connection *c, struct req *r, int status,
                             struct MHD_Response *resp)
{
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    srv_metrics_request(s->m, r->ep, status);
    r->replied = true;
    return ret;
}

static enum MHD_Result reply(struct srv *s, struct MHD_Connection *c, struct req *r, int status, const char *ctype,
                             char *body, size_t len, const char *retry_after)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, body ? body : (void *)"", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (retry_after) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    if (status == 405 && allowed_methods(s, r->ep)) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allowed_methods(s, r->ep));
    add_cors(s, resp, r->ep);
    add_connection(s, r, resp);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    return queue(s, c, r, status, resp);
}

static enum MHD_Result reply_error(struct srv *s, struct MHD_Connection *c, struct req *r,
                                   const struct srv_api_error *e)
{
    size_t n    = 0;
    char  *body = is_anthropic(r->ep) ? srv_anth_error_json(e, &n) : srv_api_error_json(e, &n);
    const char *retry = e->status == 429 || e->status == 503 ? "1" : NULL;
    return reply(s, c, r, e->status, "application/json", body, n, retry);
}

static enum MHD_Result fail(struct srv *s, struct MHD_Connection *c, struct req *r, int status, const char *param,
                            const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result fail(struct srv *s, struct MHD_Connection *c, struct req *r, int status, const char *param,
                            const char *fmt, ...)
{
    char    msg[DSV4_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct srv_api_error e;
    srv_api_fail(&e, status, param, "%s", msg);
    return reply_error(s, c, r, &e);
}

/* ------------------------------------------------------------------ clients */

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The peer closed its side or the socket failed (a client that went away). */
static bool client_gone(int fd)
{
    if (fd < 0) return false;
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Constant-time comparison of the key with "Authorization: Bearer KEY" or, as Anthropic's
 * clients send it, "x-api-key: KEY". */
static bool authorized(struct srv *s, struct MHD_Connection *c)
{
    if (!s->p.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && !strncmp(h, "Bearer ", 7)) h += 7;
    else if (!(h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"))) return false;
    size_t        n = strlen(h), k = strlen(s->p.api_key);
    unsigned char diff = n != k;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(h[i] ^ s->p.api_key[i % (k ? k : 1)]);
    return diff == 0;
}

/* ------------------------------------------------------------------ generation */

/* Finish reasons are counted where they are known: here, except slow clients, which the
 * worker counts when it cuts them (the connection may stay blocked much longer). */
static void count_finish(struct srv *s, enum srv_counter c)
{
    if (c != SRV_C_FINISH_SLOW) srv_metrics_add(s->m, c, 1);
}

/* Takes what the jobs have (waiting up to wait for the first that has nothing yet) into their
 * outputs; a stop string cancels its job; a finished job's output ends. Returns whether
 * anything happened. */
static bool pump(struct srv *s, struct srv_job **jobs, struct srv_out **outs, bool *done, enum srv_finish *fin, int n,
                 int *n_done, int *n_cached, double wait, struct srv_buf *sse)
{
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        struct srv_token ev[32];
        enum srv_finish  f;
        int              cached;
        int              k = srv_job_take(jobs[i], ev, 32, any ? 0 : wait, &f, &cached);
        if (k > 0 && srv_out_tokens(outs[i], ev, k, sse)) srv_worker_cancel(s->w, jobs[i]);
        if (k > 0) any = true;
        if (f != SRV_FINISH_NONE) {
            if (i == 0) *n_cached = cached;
            fin[i]  = f;
            done[i] = true;
            (*n_done)++;
            any = true;
        }
    }
    return any;
}

static void cancel_all(struct srv *s, struct srv_job **jobs, const bool *done, int n)
{
    for (int i = 0; i < n; i++)
        if (!done[i]) {
            srv_worker_cancel(s->w, jobs[i]);
            count_finish(s, SRV_C_FINISH_CANCELLED);
        }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream *st = cls;
    for (;;) {
        if (st->sent < st->sse.len) {
            size_t n = st->sse.len - st->sent;
            if (n > max) n = max;
            memcpy(buf, st->sse.p + st->sent, n);
            st->sent += n;
            if (st->sent == st->sse.len) st->sent = st->sse.len = 0;
            st->last_write = srv_now();
            return (ssize_t)n;
        }
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        double wait = st->s->p.keepalive_s - (srv_now() - st->last_write);
        if (wait > 0.1) wait = 0.1;
        if (wait < 0.001) wait = 0.001;
        int before = st->n_done;
        pump(st->s, st->jobs, st->outs, st->done, st->fin, st->n, &st->n_done, &st->n_cached, wait, &st->sse);
        if (st->n_done > before) {
            enum srv_counter counted[SRV_MAX_N];
            srv_out_end_all(st->outs, st->jobs, st->fin, st->ended_out, st->n, st->n_cached, &st->sse, NULL, counted);
            for (int i = 0; i < st->n; i++)
                if (counted[i] != SRV_C_COUNT) count_finish(st->s, counted[i]);
            st->ended = st->n_done == st->n;
            continue;
        }
        if (st->sse.len) continue;
        if (client_gone(st->fd)) {
            st->cut = true;
            cancel_all(st->s, st->jobs, st->done, st->n);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (srv_now() - st->last_write >= st->s->p.keepalive_s) srv_buf_puts(&st->sse, ": keep-alive\n\n");
        if (st->sse.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    if (!st->ended && !st->cut) cancel_all(st->s, st->jobs, st->done, st->n); /* closed by libmicrohttpd */
    for (int i = 0; i < st->n; i++) {
        srv_job_unref(st->jobs[i]);
        srv_out_free(st->outs[i]);
    }
    srv_buf_free(&st->sse);
    free(st);
}

static enum MHD_Result start_stream(struct srv *s, struct MHD_Connection *c, struct req *r, struct srv_out **outs)
{
    struct stream *st = calloc(1, sizeof(*st));
    if (!st) {
        for (int i = 0; i < r->n_jobs; i++) srv_out_free(outs[i]);
        return MHD_NO;
    }
    st->s = s;
    st->n = r->n_jobs;
    for (int i = 0; i < st->n; i++) {
        st->jobs[i] = r->jobs[i];
        srv_job_ref(r->jobs[i]);
        st->outs[i] = outs[i];
        srv_out_begin(outs[i], &st->sse);
    }
    st->fd         = conn_fd(c);
    st->last_write = srv_now();
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    add_cors(s, resp, r->ep);
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    return queue(s, c, r, 200, resp);
}

/* A whole-body answer: wait for the jobs here, watching the client. */
static enum MHD_Result run_whole(struct srv *s, struct MHD_Connection *c, struct req *r, struct srv_out **outs)
{
    int    fd = conn_fd(c), n = r->n_jobs, n_done = 0, n_cached = 0;
    bool            done[SRV_MAX_N] = { 0 }, ended[SRV_MAX_N] = { 0 };
    enum srv_finish fin[SRV_MAX_N]  = { 0 };
    double          checked         = srv_now();
    while (n_done < n) {
        pump(s, r->jobs, outs, done, fin, n, &n_done, &n_cached, 0.1, NULL);
        if (n_done == n || srv_now() - checked < 0.1) continue;
        checked = srv_now();
        if (client_gone(fd)) {
            cancel_all(s, r->jobs, done, n);
            for (int i = 0; i < n; i++) srv_out_free(outs[i]);
            return MHD_NO; /* nobody to answer: close */
        }
    }
    struct srv_buf   body = { 0 };
    enum srv_counter counted[SRV_MAX_N];
    int              status = srv_out_end_all(outs, r->jobs, fin, ended, n, n_cached, NULL, &body, counted);
    for (int i = 0; i < n; i++) {
        if (counted[i] != SRV_C_COUNT) count_finish(s, counted[i]);
        srv_out_free(outs[i]);
    }
    if (body.oom) {
        srv_buf_free(&body);
        return MHD_NO;
    }
    return reply(s, c, r, status, "application/json", body.p, body.len, NULL);
}

/* The vocabulary trie of constrained output, built once (the first request that asks). */
static const dsv4_json_vocab *json_vocab(struct srv *s, const dsv4_tokenizer *tok)
{
    pthread_mutex_lock(&s->mu);
    if (!s->json_vocab_tried && tok) {
        s->json_vocab_tried = true;
        struct dsv4_err err;
        if (dsv4_json_vocab_new(&s->json_vocab, tok, &err))
            srv_log(s->p.log, s->p.log_ud, DSV4_LOG_WARN, "constrained output is off: %s", err.msg);
    }
    const dsv4_json_vocab *v = s->json_vocab;
    pthread_mutex_unlock(&s->mu);
    return v;
}

static void api_ctx(struct srv *s, struct srv_api_ctx *out)
{
    struct srv_api_ctx ctx = {
        .responses                      = s->responses,
        .turns                          = s->turns,
        .model_name                     = s->model_name,
        .tok                            = srv_worker_tokenizer(s->w),
        .ctx                            = s->p.ctx,
        .default_max_tokens_completions = s->p.default_max_tokens_completions,
        .max_json_depth                 = s->p.max_json_depth,
        .special_in_messages            = s->p.special_in_messages,
    };
    struct dsv4_model_info info;
    srv_worker_info(s->w, &info, &ctx.ctx);
    ctx.vocab      = info.vocab_size;
    ctx.max_pos    = info.max_ctx;
    ctx.json_vocab = json_vocab(s, ctx.tok);
    *out           = ctx;
}

/* POST /v1/messages/count_tokens: the prompt's length, nothing generated. */
static enum MHD_Result count_tokens(struct srv *s, struct MHD_Connection *c, struct req *r)
{
    struct srv_api_ctx ctx;
    api_ctx(s, &ctx);
    struct srv_gen       g;
    struct srv_api_error e;
    if (srv_api_parse(&ctx, SRV_API_COUNT, r->body.p ? r->body.p : "", r->body.len, &g, &e))
        return reply_error(s, c, r, &e);
    char   body[64];
    int    n = snprintf(body, sizeof(body), "{\"input_tokens\":%d}", g.n_prompt);
    srv_gen_free(&g);
    return reply(s, c, r, 200, "application/json", strndup(body, (size_t)n), (size_t)n, NULL);
}

static enum MHD_Result generate(struct srv *s, struct MHD_Connection *c, struct req *r, enum srv_api_kind kind)
{
    struct srv_api_ctx ctx;
    api_ctx(s, &ctx);
    struct srv_gen       g;
    struct srv_api_error e;
    if (srv_api_parse(&ctx, kind, r->body.p ? r->body.p : "", r->body.len, &g, &e)) return reply_error(s, c, r, &e);
    /* a chat continuing an earlier turn runs on that turn's tokens (turns.c) */
    if (g.parse_chat) srv_turns_splice(s->turns, ctx.tok, &g.prompt, &g.n_prompt, ctx.ctx - g.max_tokens);
    /* one job per choice; choice i samples with seed + i and its own constraint */
    int             n = g.n > 1 ? g.n : 1;
    struct srv_job *jobs[SRV_MAX_N] = { 0 };
    struct srv_out *outs[SRV_MAX_N] = { 0 };
    bool            ok              = true;
    for (int i = 0; i < n && ok; i++) {
        jobs[i] = srv_job_new(g.prompt, g.n_prompt, g.max_tokens, s->p.stream_buffer);
        outs[i] = jobs[i] ? srv_out_new(&g, &ctx) : NULL;
        ok      = outs[i] != NULL;
        if (!ok) break;
        struct srv_job *job = jobs[i];
        srv_out_set_choice(outs[i], i, n);
        job->sp       = g.sp;
        job->sp.seed  = g.sp.seed + (uint64_t)i;
        if (g.constraint && i + 1 < n) ok = dsv4_constraint_clone(g.constraint, &job->constraint, NULL) == DSV4_OK;
        else job->constraint = g.constraint, g.constraint = NULL; /* the last job owns the original */
        job->sp.constraint = job->constraint;
        job->logprobs     = g.logprobs;
        job->top_logprobs = g.top_logprobs;
        job->ignore_eos   = g.ignore_eos;
        job->spec_draft   = g.spec_draft;
        job->t_submit     = srv_now();
    }
    bool stream = g.stream;
    srv_gen_free(&g);
    if (!ok) {
        for (int i = 0; i < n; i++) {
            srv_job_unref(jobs[i]);
            srv_out_free(outs[i]);
        }
        return fail(s, c, r, 500, NULL, "out of memory for the request");
    }

    pthread_mutex_lock(&s->mu);
    bool draining = s->draining;
    if (!draining) s->in_flight++;
    pthread_mutex_unlock(&s->mu);
    struct dsv4_err err;
    int             rc = draining ? DSV4_ECANCELED : DSV4_OK, submitted = 0;
    for (; rc == DSV4_OK && submitted < n; submitted++)
        if ((rc = srv_worker_submit(s->w, jobs[submitted], &err))) break;
    if (rc) {
        for (int i = 0; i < submitted; i++) srv_worker_cancel(s->w, jobs[i]);
        if (!draining) {
            pthread_mutex_lock(&s->mu);
            s->in_flight--;
            pthread_mutex_unlock(&s->mu);
        }
        for (int i = 0; i < n; i++) {
            srv_job_unref(jobs[i]);
            srv_out_free(outs[i]);
        }
        if (rc == DSV4_EFULL)
            return fail(s, c, r, 429, NULL, "the server is busy (%s); retry later", err.msg);
        if (rc == DSV4_ERANGE || rc == DSV4_EINVAL) return fail(s, c, r, 400, NULL, "%s", err.msg);
        return fail(s, c, r, 503, NULL, "%s", draining ? "the server is draining; retry on another instance" : err.msg);
    }
    for (int i = 0; i < n; i++) r->jobs[i] = jobs[i];
    r->n_jobs    = n;
    r->in_flight = true;
    return stream ? start_stream(s, c, r, outs) : run_whole(s, c, r, outs);
}

/* GET and DELETE /v1/responses/{id}: a stored response (docs/SERVER.md, Responses API). */
static enum MHD_Result stored_response(struct srv *s, struct MHD_Connection *c, struct req *r, const char *method)
{
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!get && strcmp(method, "DELETE")) return fail(s, c, r, 405, NULL, "use GET or DELETE /v1/responses/{id}");
    if (get) {
        char *body = srv_resp_store_response(s->responses, r->model_id);
        if (body) return reply(s, c, r, 200, "application/json", body, strlen(body), NULL);
    } else if (srv_resp_store_delete(s->responses, r->model_id)) {
        char body[160];
        int  n = snprintf(body, sizeof(body), "{\"id\":\"%.60s\",\"object\":\"response\",\"deleted\":true}", r->model_id);
        return reply(s, c, r, 200, "application/json", strndup(body, (size_t)n), (size_t)n, NULL);
    }
    struct srv_api_error e;
    srv_api_fail(&e, 404, NULL, "No response with id '%.60s' is stored here", r->model_id);
    return reply_error(s, c, r, &e);
}

/* ------------------------------------------------------------------ routing */

static enum srv_endpoint route(const char *url, struct req *r)
{
    if (!strcmp(url, "/v1/chat/completions")) return SRV_EP_CHAT;
    if (!strcmp(url, "/v1/completions")) return SRV_EP_COMPLETIONS;
    if (!strcmp(url, "/v1/messages")) return SRV_EP_MESSAGES;
    if (!strcmp(url, "/v1/messages/count_tokens")) return SRV_EP_COUNT_TOKENS;
    if (!strcmp(url, "/v1/responses")) return SRV_EP_RESPONSES;
    static const char resp[] = "/v1/responses/";
    if (!strncmp(url, resp, sizeof(resp) - 1) && url[sizeof(resp) - 1]) {
        snprintf(r->model_id, sizeof(r->model_id), "%s", url + sizeof(resp) - 1); /* the response id */
        return SRV_EP_RESPONSES;
    }
    if (!strcmp(url, "/v1/models")) return SRV_EP_MODELS;
    static const char one[] = "/v1/models/";
    if (!strncmp(url, one, sizeof(one) - 1) && url[sizeof(one) - 1]) {
        snprintf(r->model_id, sizeof(r->model_id), "%s", url + sizeof(one) - 1);
        return SRV_EP_MODELS;
    }
    if (!strcmp(url, "/health")) return SRV_EP_HEALTH;
    if (!strcmp(url, "/metrics")) return SRV_EP_METRICS;
    if (!strcmp(url, "/admin/promote")) return SRV_EP_PROMOTE;
    if (!strcmp(url, "/") && !r->s->p.no_webui) return SRV_EP_WEBUI;
    return SRV_EP_OTHER;
}

/* ------------------------------------------------------------------ the chat page */

/* GET / (docs/SERVER.md, "Chat page"): the embedded page, without authentication (it is
 * static; the API calls it makes carry the key). The policy lets the page run its own inline
 * script and style and talk to this server only: no other origin, no plugin, no frame, no
 * form target, and images only as data: URLs. Nothing the model writes becomes markup (the
 * page builds its DOM with textContent), and the policy would also stop an injected handler
 * from loading anything. */
static enum MHD_Result webui_page(struct srv *s, struct MHD_Connection *c, struct req *r)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(srv_webui_chat_html_len, (void *)srv_webui_chat_html,
                                                                MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                            "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                            "frame-ancestors 'none'");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    add_connection(s, r, resp);
    return queue(s, c, r, 200, resp);
}

static enum MHD_Result health(struct srv *s, struct MHD_Connection *c, struct req *r)
{
    struct dsv4_err          err;
    enum srv_state           st = srv_get_state(s, &err);
    json_t                  *o  = json_pack("{s:s}", "status", srv_state_name(st));
    if (o && st == SRV_STATE_FAILED) json_object_set_new(o, "detail", json_string(err.msg));
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return reply(s, c, r, st == SRV_STATE_READY ? 200 : 503, "application/json", body, body ? strlen(body) : 0,
                 st == SRV_STATE_READY ? NULL : "1");
}

static enum MHD_Result metrics(struct srv *s, struct MHD_Connection *c, struct req *r)
{
    struct srv_worker_stats ws;
    srv_worker_stats(s->w, &ws);
    ws.state = srv_get_state(s, NULL);
    size_t n    = 0;
    char  *text = srv_metrics_render(s->m, &ws, s->model_name, &n);
    if (!text) return fail(s, c, r, 500, NULL, "out of memory rendering the metrics");
    return reply(s, c, r, 200, "text/plain; version=0.0.4; charset=utf-8", text, n, NULL);
}

/* POST /admin/promote: only with the API key, and refused outright on a server without one
 * (promote those with SIGUSR1), so that reaching the port is not enough to put a standby
 * into service. Answers whether this request promoted it and the state after. */
static enum MHD_Result promote(struct srv *s, struct MHD_Connection *c, struct req *r, bool post)
{
    if (!post) return fail(s, c, r, 405, NULL, "use POST /admin/promote");
    if (!s->p.api_key)
        return fail(s, c, r, 403, NULL, "promotion over HTTP needs --api-key; promote this server with SIGUSR1");
    if (!authorized(s, c))
        return fail(s, c, r, 401, NULL, "Incorrect or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)");
    bool    was = srv_promote(s);
    json_t *o   = json_pack("{s:b,s:s}", "promoted", was, "status", srv_state_name(srv_get_state(s, NULL)));
    char   *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    srv_log(s->p.log, s->p.log_ud, DSV4_LOG_INFO, "POST /admin/promote: %s", was ? "promoted" : "was not in standby");
    return body ? reply(s, c, r, 200, "application/json", body, strlen(body), NULL)
                : fail(s, c, r, 500, NULL, "out of memory");
}

/* A CORS preflight (OPTIONS on an API path with --cors-origin): no authentication, as
 * browsers send none with it. */
static enum MHD_Result preflight(struct srv *s, struct MHD_Connection *c, struct req *r)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    add_cors(s, resp, r->ep);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", allowed_methods(s, r->ep));
    const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers", want ? want : "Authorization, Content-Type, x-api-key, anthropic-version");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    return queue(s, c, r, 204, resp);
}

static enum MHD_Result models(struct srv *s, struct MHD_Connection *c, struct req *r)
{
    size_t                 n = 0;
    struct dsv4_model_info info;
    int                    ctx;
    srv_worker_info(s->w, &info, &ctx);
    if (r->model_id[0] && strcmp(r->model_id, s->model_name) != 0) {
        struct srv_api_error e;
        srv_api_fail(&e, 404, "model", "The model '%s' does not exist; this server serves '%s'", r->model_id,
                     s->model_name);
        e.code = "model_not_found";
        return reply_error(s, c, r, &e);
    }
    char *body = srv_api_models_json(s->model_name, s->created, ctx, r->model_id[0] != '\0', &n);
    return body ? reply(s, c, r, 200, "application/json", body, n, NULL) : fail(s, c, r, 500, NULL, "out of memory");
}

static enum MHD_Result dispatch(struct srv *s, struct MHD_Connection *c, struct req *r, const char *method)
{
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (r->conn) { /* the request is in: its deadline is over */
        pthread_mutex_lock(&s->mu);
        r->conn->deadline = 0;
        bool probe        = r->conn->probe_only;
        pthread_mutex_unlock(&s->mu);
        if (probe && r->ep != SRV_EP_HEALTH && r->ep != SRV_EP_METRICS)
            return fail(s, c, r, 503, NULL, "the server has reached its connection limit (--max-conns); retry shortly");
    }
    switch (r->ep) {
    case SRV_EP_HEALTH: return get ? health(s, c, r) : fail(s, c, r, 405, NULL, "use GET /health");
    case SRV_EP_METRICS: return get ? metrics(s, c, r) : fail(s, c, r, 405, NULL, "use GET /metrics");
    case SRV_EP_PROMOTE: return promote(s, c, r, post);
    case SRV_EP_WEBUI: return get ? webui_page(s, c, r) : fail(s, c, r, 405, NULL, "use GET / (the chat page)");
    case SRV_EP_OTHER: return fail(s, c, r, 404, NULL, "no such endpoint");
    default: break;
    }
    if (!strcmp(method, "OPTIONS") && s->p.cors_origin) return preflight(s, c, r);
    if (!authorized(s, c))
        return fail(s, c, r, 401, NULL, "Incorrect or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)");
    if (r->ep == SRV_EP_MODELS) return get ? models(s, c, r) : fail(s, c, r, 405, NULL, "use GET /v1/models");
    if (r->ep == SRV_EP_RESPONSES && r->model_id[0]) return stored_response(s, c, r, method);
    if (!post) return fail(s, c, r, 405, NULL, "use POST");
    if (r->too_large) {
        return fail(s, c, r, 413, NULL, "the request body is larger than the limit of %zu bytes", s->p.max_body);
    }
    enum srv_state st = srv_get_state(s, NULL);
    if (st == SRV_STATE_LOADING) return fail(s, c, r, 503, NULL, "the model is still loading; retry shortly");
    if (st == SRV_STATE_FAILED) return fail(s, c, r, 503, NULL, "the model failed to load (see /health)");
    if (st == SRV_STATE_DRAINING)
        return fail(s, c, r, 503, NULL, "the server is draining; retry on another instance");
    if (st == SRV_STATE_STANDBY) return fail(s, c, r, 503, NULL, "standby: not promoted");
    if (r->ep == SRV_EP_COUNT_TOKENS) return count_tokens(s, c, r);
    return generate(s, c, r, r->ep == SRV_EP_CHAT        ? SRV_API_CHAT
                             : r->ep == SRV_EP_MESSAGES  ? SRV_API_MESSAGES
                             : r->ep == SRV_EP_RESPONSES ? SRV_API_RESPONSES
                                                         : SRV_API_COMPLETION);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    struct srv *s = cls;
    struct req *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof(*r)))) return MHD_NO;
        r->s     = s;
        r->ep    = route(url, r);
        *con_cls = r;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        r->conn                            = ci ? ci->socket_context : NULL;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body) { /* refuse before the upload */
            r->too_large = true;
            return fail(s, c, r, 413, NULL, "the request body is larger than the limit of %zu bytes", s->p.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!r->too_large && r->body.len + *upload_size > s->p.max_body) {
            r->too_large = true;
            srv_buf_free(&r->body);
        }
        if (!r->too_large) srv_buf_put(&r->body, upload, *upload_size);
        if (r->body.oom) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->replied) return MHD_YES;
    return dispatch(s, c, r, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)c;
    struct srv *s = cls;
    struct req *r = *con_cls;
    if (!r) return;
    for (int i = 0; i < r->n_jobs; i++) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) srv_worker_cancel(s->w, r->jobs[i]);
        srv_job_unref(r->jobs[i]);
    }
    pthread_mutex_lock(&s->mu);
    if (r->in_flight) s->in_flight--;
    if (r->conn) r->conn->deadline = srv_now() + s->p.request_timeout_s; /* the next request's */
    pthread_mutex_unlock(&s->mu);
    srv_buf_free(&r->body);
    free(r);
    *con_cls = NULL;
}

/* Probe connections must send their request quickly: they are the reserve. */
static double probe_timeout(const struct srv *s)
{
    return s->p.request_timeout_s < 5 ? s->p.request_timeout_s : 5;
}

/* Counts connections, tracks each one for the watchdog (a connection past max_conns is a
 * probe connection) and bounds each one's kernel send buffer (which also turns off its
 * auto-tuning), so the bytes a stalled client can leave unsent are bounded. libmicrohttpd
 * reports the close before it closes the socket, so a listed fd is always open. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx, enum MHD_ConnectionNotificationCode code)
{
    struct srv *s = cls;
    srv_metrics_connections(s->m, code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
    if (code != MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn *k = *socket_ctx;
        if (!k) return;
        pthread_mutex_lock(&s->mu);
        if (k->prev) k->prev->next = k->next;
        else s->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        if (!k->probe_only) s->n_general--;
        pthread_mutex_unlock(&s->mu);
        free(k);
        *socket_ctx = NULL;
        return;
    }
    int fd = conn_fd(c);
    int sz = s->p.send_buffer;
    if (fd >= 0 && sz > 0 && setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz)) != 0)
        srv_log(s->p.log, s->p.log_ud, DSV4_LOG_DEBUG, "http: SO_SNDBUF %d: %s", sz, strerror(errno));
    struct conn *k = calloc(1, sizeof(*k));
    *socket_ctx    = k;
    if (!k) return; /* untracked: the idle timeout still applies */
    k->fd = fd;
    pthread_mutex_lock(&s->mu);
    k->probe_only = s->n_general >= s->p.max_conns;
    if (!k->probe_only) s->n_general++;
    k->deadline = srv_now() + (k->probe_only ? probe_timeout(s) : s->p.request_timeout_s);
    k->next     = s->conns;
    if (s->conns) s->conns->prev = k;
    s->conns = k;
    pthread_mutex_unlock(&s->mu);
}

/* Closes the connections whose request did not arrive by its deadline (file header). */
static void *watchdog_main(void *arg)
{
    struct srv *s = arg;
    for (;;) {
        struct timespec tick = { 0, 100 * 1000 * 1000 };
        nanosleep(&tick, NULL);
        double now = srv_now();
        int    cut = 0;
        pthread_mutex_lock(&s->mu);
        if (s->stopping) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        for (struct conn *k = s->conns; k; k = k->next) {
            if (k->deadline <= 0 || now < k->deadline || k->fd < 0) continue;
            shutdown(k->fd, SHUT_RDWR);
            k->deadline = 0;
            cut++;
        }
        pthread_mutex_unlock(&s->mu);
        if (cut) {
            srv_metrics_add(s->m, SRV_C_HTTP_REQUEST_TIMEOUT, cut);
            srv_log(s->p.log, s->p.log_ud, DSV4_LOG_DEBUG, "http: closed %d connection(s) past the request deadline", cut);
        }
    }
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct srv *s = cls;
    char        msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    srv_log(s->p.log, s->p.log_ud, DSV4_LOG_DEBUG, "http: %s", msg);
}

/* ------------------------------------------------------------------ lifecycle */

const char *srv_state_name(enum srv_state st)
{
    static const char *const names[SRV_STATE_COUNT] = { "loading", "ok", "draining", "failed", "standby" };
    return (unsigned)st < SRV_STATE_COUNT ? names[st] : "unknown";
}

enum srv_state srv_get_state(struct srv *s, struct dsv4_err *load_err)
{
    enum srv_state st = srv_worker_state(s->w, load_err);
    pthread_mutex_lock(&s->mu);
    if (s->draining && st != SRV_STATE_FAILED) st = SRV_STATE_DRAINING;
    else if (s->standby && st == SRV_STATE_READY) st = SRV_STATE_STANDBY;
    pthread_mutex_unlock(&s->mu);
    return st;
}

bool srv_promote(struct srv *s)
{
    pthread_mutex_lock(&s->mu);
    bool was   = s->standby;
    s->standby = false;
    pthread_mutex_unlock(&s->mu);
    return was;
}

int srv_port(const struct srv *s)
{
    return s->port;
}

int srv_in_flight(struct srv *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->in_flight;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void srv_drain(struct srv *s)
{
    pthread_mutex_lock(&s->mu);
    bool was = s->draining;
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
    if (was) return;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

static void base_name(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

/* The listening socket, bound before anything slow starts: a port in use is an error at
 * once, not after the model has loaded. */
static int listen_on(const struct addrinfo *ai, const char *host, int port, int *out, struct dsv4_err *err)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return srv_err(err, DSV4_EIO, "cannot create a socket for %s: %s", host, strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        return srv_err(err, DSV4_EIO, "cannot listen on %s:%d: %s%s", host, port, strerror(e),
                       e == EADDRINUSE ? " (another process has the port: choose another with --port)" : "");
    }
    *out = fd;
    return DSV4_OK;
}

static int bound_port(int fd)
{
    struct sockaddr_storage a;
    socklen_t               n = sizeof(a);
    if (getsockname(fd, (struct sockaddr *)&a, &n) != 0) return -1;
    if (a.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&a)->sin_port);
    if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return -1;
}

int srv_start(struct srv **out, const struct srv_params *p, struct dsv4_err *err)
{
    *out = NULL;
    if (!p->model_dir) return srv_err(err, DSV4_EINVAL, "no model directory");
    if (p->port < 0 || p->port > 65535) return srv_err(err, DSV4_EINVAL, "port %d is not in 0..65535", p->port);
    if (p->max_conns < 1 || p->idle_timeout_s < 1 || p->max_body < 1 || p->max_json_depth < 1 || p->keepalive_s <= 0 ||
        p->stream_buffer < 1 || p->request_timeout_s <= 0 || p->max_conns_per_ip < 0)
        return srv_err(err, DSV4_EINVAL, "connection limits, timeouts, buffer sizes and tiers must be positive");
    if (p->api_key && !p->api_key[0])
        return srv_err(err, DSV4_EINVAL, "the API key is empty: give a key, or none to serve without authentication");
    struct srv *s = calloc(1, sizeof(*s));
    if (!s) return srv_err(err, DSV4_ENOMEM, "out of memory");
    s->p = *p;
    if (!s->p.host) s->p.host = "127.0.0.1";
    if (p->model_name) snprintf(s->model_name, sizeof(s->model_name), "%s", p->model_name);
    else base_name(p->model_dir, s->model_name, sizeof(s->model_name));
    s->created = (long long)time(NULL);
    s->standby = p->standby;
    pthread_mutex_init(&s->mu, NULL);
    int rc = DSV4_OK;
    if (!(s->m = srv_metrics_new()) ||
        !(s->responses = srv_resp_store_new(p->responses_store, (size_t)p->responses_store_mb << 20)) ||
        !(s->turns = srv_turns_new())) {
        rc = srv_err(err, DSV4_ENOMEM, "out of memory");
        goto fail_metrics;
    }

    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai = NULL;
    char            port[16];
    snprintf(port, sizeof(port), "%d", p->port);
    int gai = getaddrinfo(s->p.host, port, &hints, &ai);
    if (gai != 0) {
        rc = srv_err(err, DSV4_EINVAL, "cannot resolve the address '%s': %s", s->p.host, gai_strerror(gai));
        goto fail_addr;
    }
    int lfd = -1;
    if ((rc = listen_on(ai, s->p.host, p->port, &lfd, err))) goto fail_listen;

    struct srv_worker_params wp = {
        .model_dir     = p->model_dir,
        .max_seqs      = p->max_seqs,
        .ctx           = p->ctx,
        .max_queue     = p->max_queue,
        .max_batch_tokens   = p->max_batch_tokens,
        .max_prefill_tokens = p->max_prefill_tokens,
        .prefill_share      = p->prefill_share,
        .kv_pages           = p->kv_pages,
        .prefix_entries     = p->prefix_entries,
        .keep_finished      = p->keep_finished,
        .kv_disk_dir        = p->kv_disk_dir,
        .kv_disk_budget     = p->kv_disk_budget,
        .spec_draft         = p->spec_draft,
        .tier_tokens        = { p->tier_tokens[0], p->tier_tokens[1] },
        .mem_limit          = p->mem_limit,
        .map_weights        = p->standby || !p->lazy_weights,
        .warm               = p->standby,
        .engine        = p->engine,
        .metrics       = s->m,
        .log           = p->log,
        .log_ud        = p->log_ud,
    };
    if ((rc = srv_worker_start(&s->w, &wp, err))) goto fail_worker;

    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, lfd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(p->max_conns + SRV_PROBE_CONNS),
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)p->max_conns_per_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->idle_timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_THREAD_STACK_SIZE,
                            (size_t)1 << 20, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s, MHD_OPTION_END);
    if (!s->d) {
        rc = srv_err(err, DSV4_EIO, "cannot serve on %s:%d (%s)", s->p.host, p->port,
                     errno ? strerror(errno) : "libmicrohttpd refused the options");
        goto fail_daemon;
    }
    lfd     = -1; /* the daemon's now */
    s->port = bound_port(MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_LISTEN_FD)->listen_fd);
    if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
        rc = srv_err(err, DSV4_ENOMEM, "could not start the connection watchdog");
        MHD_stop_daemon(s->d);
        goto fail_daemon;
    }
    s->watchdog_started = true;
    freeaddrinfo(ai);
    *out = s;
    return DSV4_OK;

fail_daemon:
    srv_worker_stop(s->w);
fail_worker:
    if (lfd >= 0) close(lfd);
fail_listen:
    freeaddrinfo(ai);
fail_addr:
fail_metrics:
    srv_metrics_free(s->m);
    srv_resp_store_free(s->responses);
    srv_turns_free(s->turns);
    dsv4_json_vocab_free(s->json_vocab);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return rc;
}

void srv_stop(struct srv *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->draining = true; /* nothing new is submitted from here on */
    int cut     = s->in_flight;
    pthread_mutex_unlock(&s->mu);
    srv_worker_cancel_all(s->w);
    /* Each cut request is answered (an SSE error event and [DONE], or a 503) before the
     * connections close; a client that does not read gets at most 2 s of that. */
    double until = srv_now() + 2.0;
    while (srv_in_flight(s) > 0 && srv_now() < until) {
        struct timespec t = { 0, 10 * 1000 * 1000 };
        nanosleep(&t, NULL);
    }
    if (cut)
        srv_log(s->p.log, s->p.log_ud, DSV4_LOG_WARN,
                "shutdown cut %d request(s): streams ended with an error event and [DONE], others with a 503; "
                "%d not answered in time",
                cut, srv_in_flight(s));
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    if (s->watchdog_started) pthread_join(s->watchdog, NULL);
    MHD_stop_daemon(s->d);
    srv_worker_stop(s->w);
    srv_metrics_free(s->m);
    srv_resp_store_free(s->responses);
    srv_turns_free(s->turns);
    dsv4_json_vocab_free(s->json_vocab);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
