/*
 * loadtest_mix.c - the client threads of `dsv4 loadtest` and the kinds of request they
 * send (loadtest_shared.h): streamed (the default, and the only kind the latency gates
 * were made for), plain, streamed and hung up on, malformed, and sent slowly.
 *
 * Each request is written out whole here (request line, headers, body) and sent with
 * http_open_raw, so every kind goes through one path and a failure can be told apart by
 * where it happened: no connection, a request the server stopped taking, a request
 * without an answer. Only the request line's target changes between kinds; the bodies of
 * good requests are the ones loadtest always sent, with "stream": false for plain ones.
 *
 * What a kind expects:
 *   stream, slow  200 and SSE events up to [DONE], none of them an error;
 *   plain         200 and one JSON body with choices[0];
 *   disconnect    200 and SSE events; after a random number of them (1 to max_tokens/2)
 *                 the client closes the socket: the server must cancel the sequence;
 *   bad           4xx. Variants: JSON that does not parse, a body that is no object, a
 *                 duplicate key, wrong types, values out of range, unknown values of
 *                 fields with a fixed set (role, model, content part type, effort),
 *                 features the server refuses, and a Content-Length above --max-body
 *                 (only the headers are sent: the server must refuse from the header;
 *                 sending the body too would have the server reset a connection that
 *                 still holds unread bytes, which loses the 413). Unknown top-level fields are
 *                 in it too: dsv4 answers them with 400 (docs/SERVER.md).
 *   slow          as stream; the server may cut it (closing, or 408) under its request
 *                 or idle timeouts: that is counted as the expected server_cut, not an
 *                 error.
 *                 Slow senders always send the short prompt class.
 * Latency samples come from stream and disconnect requests (TTFT and ITL; E2E from the
 * completed ones) and plain ones (E2E); a slow sender gives only ITL, since its TTFT and
 * E2E measure its own sending.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli.h"
#include "loadtest_shared.h"

/* Bytes per piece of a slow request: a few, so a ~500-byte request takes ~60 pieces. */
enum { SLOW_PIECE = 8, MAX_ITL_PER_REQUEST = 4096 };
/* After a failed connection a client waits this long before its next request. */
enum { CONNECT_BACKOFF_MS = 100 };

/* A bad request waits at most this long for its answer: a server that does not refuse
 * the oversized one from its header keeps it until its own request timeout. */
static const double BAD_TIMEOUT_S = 60;

/* ------------------------------------------------------------------ requests */

static const char *const WORDS[] = {
    "the",    "river",  "of",     "light",   "ran",    "through", "a",      "quiet",  "valley", "where",
    "old",    "stone",  "houses", "kept",    "their",  "doors",   "open",   "to",     "every",  "traveller",
    "who",    "brought", "news",  "from",    "distant", "cities", "and",    "markets", "in",    "autumn",
    "farmers", "counted", "grain", "while",  "children", "learned", "letters", "by",    "lamp",   "after",
    "supper", "merchants", "weighed", "silver", "on",    "brass",   "scales", "before",  "dawn",  "sailors",
};

/* The body of a good request for one prompt of `len` words or tokens. */
static char *make_body(const struct lt_opts *o, const char *model, bool completions, bool stream, int len,
                       unsigned long long *rng)
{
    json_t *req = json_pack("{s:s, s:b, s:i, s:f}", "model", model, "stream", stream, "max_tokens", o->max_tokens,
                            "temperature", o->temperature);
    if (!req) return NULL;
    if (stream) json_object_set_new(req, "stream_options", json_pack("{s:b}", "include_usage", 1));
    json_object_set_new(req, "seed", json_integer((json_int_t)(lt_rand(rng) >> 2)));
    if (o->ignore_eos) json_object_set_new(req, "ignore_eos", json_true());
    if (o->token_prompts) {
        json_t *ids = json_array();
        for (int i = 0; i < len; i++) json_array_append_new(ids, json_integer((json_int_t)(lt_rand(rng) % (unsigned)o->vocab)));
        json_object_set_new(req, "prompt", ids);
    } else {
        size_t nw = sizeof(WORDS) / sizeof(WORDS[0]), cap = (size_t)len * 12 + 64, k = 0;
        char  *text = malloc(cap);
        if (!text) {
            json_decref(req);
            return NULL;
        }
        k += (size_t)snprintf(text, cap, "Request %llu:", lt_rand(rng) % 1000000);
        for (int i = 0; i < len; i++) k += (size_t)snprintf(text + k, cap - k, " %s", WORDS[lt_rand(rng) % nw]);
        if (completions) json_object_set_new(req, "prompt", json_string(text));
        else json_object_set_new(req, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", text));
        free(text);
    }
    char *s = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return s;
}

/* The bad requests, each answered 4xx by a conforming server (see the file header). */
static const struct {
    bool        completions;
    const char *what;
    const char *body; /* NULL: oversized (a Content-Length above --max-body, no body sent) */
} BAD[] = {
    { false, "truncated JSON", "{\"messages\": [{\"role\": \"user\", \"content\": \"In the beginning\"}" },
    { false, "trailing comma", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],}" },
    { false, "not an object", "[\"messages\"]" },
    { false, "duplicate key",
      "{\"stream\": true, \"stream\": false, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}" },
    { false, "messages not an array", "{\"messages\": \"And God said\"}" },
    { false, "max_tokens a string",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": \"many\"}" },
    { false, "stream a string", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": \"yes\"}" },
    { false, "temperature 7", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": 7}" },
    { false, "unknown role", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}" },
    { false, "unknown content part",
      "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"hologram\"}]}]}" },
    { false, "unknown reasoning_effort",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"reasoning_effort\": \"extreme\"}" },
    { false, "unknown model",
      "{\"model\": \"no-such-model\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}" },
    { false, "logit_bias out of range",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logit_bias\": {\"5\": 500}}" },
    { false, "unknown field", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"mirostat\": 2}" },
    { false, "oversized body", NULL },
    { true, "truncated JSON", "{\"prompt\": \"In the beginning\"" },
    { true, "prompt a number", "{\"prompt\": 42}" },
    { true, "max_tokens -5", "{\"prompt\": \"hi\", \"max_tokens\": -5}" },
    { true, "two prompts", "{\"prompt\": [\"one\", \"two\"]}" },
    { true, "suffix", "{\"prompt\": \"hi\", \"suffix\": \"amen\"}" },
    { true, "unknown model", "{\"model\": \"no-such-model\", \"prompt\": \"hi\"}" },
    { true, "unknown field", "{\"prompt\": \"hi\", \"grammar\": \"root ::= x\"}" },
    { true, "oversized body", NULL },
};

/*
 * The whole request: request line, headers, body. content_length < 0: the body's own;
 * otherwise that value is announced (and the body, normally empty, sent as it is).
 */
static char *make_request(const struct lt_opts *o, bool completions, const char *body, long long content_length,
                          size_t *out_len)
{
    size_t blen = strlen(body);
    size_t cap  = blen + strlen(o->url.path) + strlen(o->url.host) + (o->api_key ? strlen(o->api_key) : 0) + 256;
    char  *req  = malloc(cap);
    if (!req) return NULL;
    int k = snprintf(req, cap,
                     "POST %s/v1/%s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n%s%s%s"
                     "Content-Type: application/json\r\nContent-Length: %lld\r\n\r\n",
                     o->url.path, completions ? "completions" : "chat/completions", o->url.host, o->url.port,
                     o->api_key ? "Authorization: Bearer " : "", o->api_key ? o->api_key : "", o->api_key ? "\r\n" : "",
                     content_length < 0 ? (long long)blen : content_length);
    memcpy(req + k, body, blen);
    *out_len = (size_t)k + blen;
    return req;
}

/* ------------------------------------------------------------------ responses */

/* One request's result, added to the shared counters at its end. */
struct lt_result {
    enum lt_outcome out;
    int             status;
    double          t0, t_first, t_last, t_end;
    double          itl[MAX_ITL_PER_REQUEST];
    int             n_itl;
    long            n_out, usage_out, usage_prompt;
    char            what[256];
};

/* True when a chunk carries output (not just the role or usage). */
static bool has_output(json_t *chunk, bool *is_error)
{
    *is_error = json_object_get(chunk, "error") != NULL;
    json_t *ch = json_array_get(json_object_get(chunk, "choices"), 0);
    if (!ch) return false;
    json_t *d = json_object_get(ch, "delta");
    if (d) {
        const char *c = json_string_value(json_object_get(d, "content"));
        const char *r = json_string_value(json_object_get(d, "reasoning_content"));
        return (c && *c) || (r && *r) || json_array_size(json_object_get(d, "tool_calls")) > 0;
    }
    const char *t = json_string_value(json_object_get(ch, "text"));
    return (t && *t) || json_array_size(json_object_get(ch, "token_ids")) > 0;
}

static void take_usage(json_t *doc, struct lt_result *r)
{
    json_t *u = json_object_get(doc, "usage");
    if (!json_is_object(u)) return;
    r->usage_out    = (long)json_integer_value(json_object_get(u, "completion_tokens"));
    r->usage_prompt = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
}

/* Reads an SSE response to [DONE] or its end; cut_after > 0 closes after that many events. */
static void read_stream(struct http_conn *c, int cut_after, struct lt_result *r)
{
    const char *data;
    size_t      len;
    int         ev, n_events = 0;
    bool        done = false;
    while ((ev = http_sse_next(c, &data, &len)) > 0) {
        if (ev == 2) continue;
        if (!strcmp(data, "[DONE]")) {
            done = true;
            break;
        }
        json_t *chunk = json_loadb(data, len, JSON_ALLOW_NUL, NULL);
        if (!chunk) {
            snprintf(r->what, sizeof(r->what), "an SSE event that is not JSON: %.100s", data);
            r->out = LT_OUT_BAD_BODY;
            return;
        }
        bool   is_err;
        double now = cli_now();
        if (has_output(chunk, &is_err)) {
            if (r->t_first < 0) r->t_first = now;
            else if (r->n_itl < MAX_ITL_PER_REQUEST) r->itl[r->n_itl++] = now - r->t_last;
            r->t_last = now;
            r->n_out++;
        }
        take_usage(chunk, r);
        if (is_err && r->out != LT_OUT_ERROR_EVENT) {
            char *e = json_dumps(json_object_get(chunk, "error"), JSON_COMPACT);
            snprintf(r->what, sizeof(r->what), "error event: %.200s", e ? e : "?");
            free(e);
            r->out = LT_OUT_ERROR_EVENT;
        }
        json_decref(chunk);
        /* The cut happens with the socket still open and the server still generating. */
        if (cut_after > 0 && ++n_events >= cut_after && r->out == LT_OUT_DONE) {
            r->out = LT_OUT_CLIENT_CUT;
            return;
        }
    }
    if (r->out == LT_OUT_DONE && !done) {
        snprintf(r->what, sizeof(r->what), "the stream ended without [DONE]%s",
                 ev < 0 ? " (read error or timeout)" : "");
        r->out = LT_OUT_NO_DONE;
    }
}

/* Reads a whole (not streamed) 200 response. */
static void read_plain(struct http_conn *c, bool completions, struct lt_result *r)
{
    size_t len  = 0;
    char  *body = http_read_all(c, &len);
    json_t *doc = body ? json_loadb(body, len, JSON_ALLOW_NUL, NULL) : NULL;
    json_t *ch  = json_array_get(json_object_get(doc, "choices"), 0);
    bool    ok  = completions ? json_is_string(json_object_get(ch, "text"))
                              : json_is_object(json_object_get(ch, "message"));
    if (ok) {
        take_usage(doc, r);
    } else {
        const char *why = !body ? "cut short" : !doc ? "that is not JSON" : "without choices[0]";
        snprintf(r->what, sizeof(r->what), "a 200 body %s: %.100s", why, body ? body : "");
        r->out = LT_OUT_BAD_BODY;
    }
    json_decref(doc);
    free(body);
}

/* The outcome of a non-200 answer to a good request. */
static enum lt_outcome status_outcome(enum lt_kind kind, int status)
{
    if (kind == LT_KIND_SLOW && status == 408) return LT_OUT_SERVER_CUT;
    if (status >= 400 && status < 500) return LT_OUT_HTTP_4XX;
    if (status >= 500 && status < 600) return LT_OUT_HTTP_5XX;
    return LT_OUT_HTTP_OTHER;
}

static enum lt_outcome open_failure_outcome(enum lt_kind kind, int rc)
{
    if (rc == HTTP_OPEN_ECONNECT) return LT_OUT_CONNECT;
    if (kind == LT_KIND_SLOW) return LT_OUT_SERVER_CUT; /* closed on while (or after) sending slowly */
    return rc == HTTP_OPEN_ESEND ? LT_OUT_CONNECT : LT_OUT_NO_RESPONSE;
}

/* ------------------------------------------------------------------ one request */

static void finish(struct lt_shared *sh, enum lt_kind kind, int cls, const struct lt_result *r)
{
    bool timed = r->out == LT_OUT_DONE || r->out == LT_OUT_CLIENT_CUT;
    int  q     = sh->o->soak ? lt_quarter(sh, r->t_end) : -1;
    pthread_mutex_lock(&sh->mu);
    sh->count[kind][r->out]++;
    if (r->status == 429) sh->refused++;
    if (lt_outcome_is_error(r->out) && !sh->first_error[0]) {
        if (kind == LT_KIND_STREAM) snprintf(sh->first_error, sizeof(sh->first_error), "%s", r->what);
        else snprintf(sh->first_error, sizeof(sh->first_error), "%s request: %.200s", lt_kind_name[kind], r->what);
    }
    if (timed) {
        sh->out_tokens += r->out == LT_OUT_DONE && r->usage_out >= 0 ? r->usage_out : r->n_out;
        if (r->usage_prompt > 0) sh->prompt_tokens += r->usage_prompt;
        if (r->t_first >= 0 && kind != LT_KIND_SLOW) {
            lt_samples_add(&sh->ttft, r->t_first - r->t0);
            lt_samples_add(&sh->win_ttft, r->t_first - r->t0);
        }
        /* A request's gaps go to the window and quarter it ends in: requests last
         * seconds, windows and quarters minutes. */
        for (int i = 0; i < r->n_itl; i++) {
            lt_samples_add(&sh->itl, r->itl[i]);
            lt_samples_add(&sh->win_itl, r->itl[i]);
            if (q >= 0) lt_samples_add(&sh->q_itl[q], r->itl[i]);
        }
        if (r->out == LT_OUT_DONE) {
            sh->by_class[cls]++;
            if (kind != LT_KIND_SLOW) lt_samples_add(&sh->e2e, r->t_end - r->t0);
        }
    }
    pthread_mutex_unlock(&sh->mu);
}

static char *make_bad(const struct lt_opts *o, bool completions, unsigned long long *rng, size_t *len,
                      const char **what)
{
    int n = 0, idx[sizeof(BAD) / sizeof(BAD[0])];
    for (int i = 0; i < (int)(sizeof(BAD) / sizeof(BAD[0])); i++)
        if (BAD[i].completions == completions) idx[n++] = i;
    int b = idx[lt_rand(rng) % (unsigned)n];
    *what = BAD[b].what;
    return BAD[b].body ? make_request(o, completions, BAD[b].body, -1, len)
                       : make_request(o, completions, "", o->max_body + 1, len);
}

/* Sends one request of the kind and counts its outcome, which it returns. */
static enum lt_outcome one_request(struct lt_thread *t, enum lt_kind kind, int cls, bool completions)
{
    struct lt_shared     *sh = t->sh;
    const struct lt_opts *o  = sh->o;
    struct lt_result     *r  = malloc(sizeof(*r)); /* its ITL buffer is 32 KiB */
    if (!r) return LT_OUT_CONNECT;
    memset(r, 0, sizeof(*r));
    r->out          = LT_OUT_DONE;
    r->t_first      = -1;
    r->usage_out    = -1;
    r->usage_prompt = -1;
    const char *bad_what = NULL;
    size_t      req_len  = 0;
    char       *req      = NULL;
    if (kind == LT_KIND_BAD) {
        req = make_bad(o, completions, &t->rng, &req_len, &bad_what);
    } else {
        char *body = make_body(o, sh->model, completions, kind != LT_KIND_PLAIN, o->length[cls], &t->rng);
        if (body) req = make_request(o, completions, body, -1, &req_len);
        free(body);
    }
    if (!req) {
        snprintf(r->what, sizeof(r->what), "out of memory");
        r->out = LT_OUT_CONNECT;
        finish(sh, kind, cls, r);
        free(r);
        return LT_OUT_CONNECT;
    }
    struct http_conn c;
    char             err[256];
    double           timeout = kind == LT_KIND_BAD && o->timeout_s > BAD_TIMEOUT_S ? BAD_TIMEOUT_S : o->timeout_s;
    unsigned         half    = o->max_tokens >= 2 ? (unsigned)(o->max_tokens / 2) : 1;
    int              cut     = kind == LT_KIND_DISCONNECT ? 1 + (int)(lt_rand(&t->rng) % half) : 0;
    r->t0                    = cli_now();
    int rc = http_open_raw(&c, o->url.host, o->url.port, req, req_len, kind == LT_KIND_SLOW ? SLOW_PIECE : 0,
                           o->slow_pause_s, timeout, err, sizeof(err));
    free(req);
    if (rc != HTTP_OPEN_OK) {
        r->out = open_failure_outcome(kind, rc);
        snprintf(r->what, sizeof(r->what), "%s", err);
    } else if (kind == LT_KIND_BAD || c.status != 200) {
        char *b   = http_read_all(&c, NULL);
        r->status = c.status;
        if (kind != LT_KIND_BAD) r->out = status_outcome(kind, c.status);
        else if (c.status >= 400 && c.status < 500) r->out = LT_OUT_BAD_4XX;
        else r->out = c.status >= 500 && c.status < 600 ? LT_OUT_HTTP_5XX : LT_OUT_HTTP_OTHER;
        snprintf(r->what, sizeof(r->what), "HTTP %d%s%s%s: %.160s", c.status, bad_what ? " to a bad request (" : "",
                 bad_what ? bad_what : "", bad_what ? ")" : "", b ? b : "");
        free(b);
    } else if (kind == LT_KIND_PLAIN) {
        r->status = 200;
        read_plain(&c, completions, r);
    } else {
        r->status = 200;
        read_stream(&c, cut, r);
    }
    r->t_end = cli_now();
    http_close(&c);
    finish(sh, kind, cls, r);
    enum lt_outcome out = r->out;
    free(r);
    return out;
}

/* ------------------------------------------------------------------ threads */

static enum lt_kind draw_kind(const struct lt_opts *o, unsigned long long *rng)
{
    double total = 0;
    for (int k = 0; k < LT_KIND_SLOW; k++) total += o->kind_weight[k];
    double r = lt_rand_unit(rng) * total;
    int    k = 0;
    while (k < LT_KIND_SLOW - 1 && (r >= o->kind_weight[k] || o->kind_weight[k] == 0)) r -= o->kind_weight[k++];
    while (o->kind_weight[k] == 0 && k > 0) k--; /* rounding past the last weighted kind */
    return (enum lt_kind)k;
}

static int draw_class(const struct lt_opts *o, unsigned long long *rng)
{
    double total = 0;
    for (int k = 0; k < LT_N_CLASS; k++) total += o->weight[k];
    double r   = lt_rand_unit(rng) * total;
    int    cls = 0;
    while (cls < LT_N_CLASS - 1 && r >= o->weight[cls]) r -= o->weight[cls++];
    while (o->weight[cls] == 0 && cls > 0) cls--;
    return cls;
}

void *lt_client_main(void *arg)
{
    struct lt_thread     *t  = arg;
    struct lt_shared     *sh = t->sh;
    const struct lt_opts *o  = sh->o;
    for (;;) {
        pthread_mutex_lock(&sh->mu);
        bool go = o->requests > 0 ? sh->started < o->requests : cli_now() < sh->t_end;
        if (go) sh->started++;
        pthread_mutex_unlock(&sh->mu);
        if (!go) break;
        enum lt_kind kind = t->slow ? LT_KIND_SLOW : draw_kind(o, &t->rng);
        int          cls  = t->slow ? 0 : draw_class(o, &t->rng);
        bool completions  = o->token_prompts ||
                           (o->completions_share > 0 && lt_rand_unit(&t->rng) < o->completions_share);
        if (one_request(t, kind, cls, completions) == LT_OUT_CONNECT) {
            /* A server that is gone is not hammered: the failures are counted either way. */
            struct timespec ts = { 0, CONNECT_BACKOFF_MS * 1000000L };
            nanosleep(&ts, NULL);
        }
    }
    pthread_mutex_lock(&sh->mu);
    sh->running--;
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}
