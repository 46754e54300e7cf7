/*
 * api_util.c - what every API dialect shares: the error record and OpenAI's error body,
 * request fields read with their checks (absent or null: the default; the wrong type or
 * range: a 400 naming the field), random ids, the nesting bound, GET /v1/models, and the
 * end of a whole answer (srv_out_body).
 *
 * A leaf of the API side: it calls no dialect by name (srv_out_body reaches the dialect's
 * error shape through the output's table entry).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "server/api.h"

/* ------------------------------------------------------------------ errors */

int srv_api_fail(struct srv_api_error *e, int status, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    e->status = status;
    e->param  = param;
    e->code   = NULL;
    switch (status) {
    case 401:
        e->type = "invalid_request_error";
        e->code = "invalid_api_key";
        break;
    case 404: e->type = "invalid_request_error"; e->code = "not_found"; break;
    case 413: e->type = "invalid_request_error"; e->code = "request_too_large"; break;
    case 429: e->type = "rate_limit_error"; e->code = "queue_full"; break;
    case 503: e->type = "service_unavailable"; break;
    default: e->type = status >= 500 ? "server_error" : "invalid_request_error"; break;
    }
    return -1;
}

char *srv_api_error_json(const struct srv_api_error *e, size_t *len)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->msg, "type", e->type, "param",
                          e->param ? json_string(e->param) : json_null(), "code",
                          e->code ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) { /* the message was not UTF-8 (it quotes client input): say less */
        o = json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", "invalid request (the detail is not UTF-8)",
                      "type", e->type, "param", "code");
        s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
    }
    if (s && len) *len = strlen(s);
    return s;
}

void srv_api_param(struct srv_api_error *e, const char *key)
{
    snprintf(e->param_buf, sizeof(e->param_buf), "%s", key);
    e->param = e->param_buf;
}

int srv_out_body(struct srv_out *o, json_t *answer, const struct srv_api_error *e, struct srv_buf *body)
{
    char  *s = NULL;
    size_t n = 0;
    if (e) s = o->d->error(e, &n);
    else if (answer) s = json_dumps(answer, JSON_COMPACT);
    json_decref(answer);
    if (s && !e) n = strlen(s);
    struct srv_api_error oom;
    if (!s) {
        srv_api_fail(&oom, 500, NULL, "out of memory building the response");
        s = o->d->error(&oom, &n);
        e = &oom;
    }
    if (s) srv_buf_put(body, s, n);
    free(s);
    return e ? e->status : 200;
}

/* ------------------------------------------------------------------ fields and ids */

int srv_json_depth(const char *s, size_t n)
{
    int  depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max) max = depth;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return max;
}

/* Random 64-bit values for ids and default seeds: splitmix64 over a shared counter seeded
 * once from the clock, so concurrent requests never draw the same value. */
static _Atomic uint64_t rand_ctr;
static pthread_once_t   rand_once = PTHREAD_ONCE_INIT;

static void rand_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    atomic_store(&rand_ctr, (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30));
}

uint64_t srv_random_u64(void)
{
    pthread_once(&rand_once, rand_seed);
    uint64_t z = atomic_fetch_add(&rand_ctr, 0x9e3779b97f4a7c15ull) + 0x9e3779b97f4a7c15ull;
    z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void srv_api_make_id(char *out, size_t cap, const char *prefix)
{
    snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)srv_random_u64(),
             (unsigned long long)(srv_random_u64() & 0xffffffffu));
}

/* The field, or NULL when absent or null. */
json_t *srv_json_field(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

int srv_json_bool(json_t *o, const char *key, bool *out, struct srv_api_error *e)
{
    json_t *v = srv_json_field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return srv_api_fail(e, 400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

int srv_json_num(json_t *o, const char *key, double lo, double hi, bool lo_open, double *out,
                   struct srv_api_error *e)
{
    json_t *v = srv_json_field(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return srv_api_fail(e, 400, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi) || (lo_open && x == lo))
        return srv_api_fail(e, 400, key, "'%s' is %g; it must be in %s%g, %g]", key, x, lo_open ? "(" : "[", lo, hi);
    *out = x;
    return 0;
}

int srv_json_int(json_t *o, const char *key, long long lo, long long hi, long long *out, struct srv_api_error *e)
{
    json_t *v = srv_json_field(o, key);
    if (!v) return 0;
    if (!json_is_integer(v)) return srv_api_fail(e, 400, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return srv_api_fail(e, 400, key, "'%s' is %lld; it must be in [%lld, %lld]", key, x, lo, hi);
    *out = x;
    return 0;
}

const char *srv_json_unknown_key(json_t *o, const char *const *lists[], int n_lists)
{
    const char *key;
    json_t     *v;
    json_object_foreach(o, key, v) {
        bool known = false;
        for (int l = 0; l < n_lists && !known; l++)
            for (const char *const *k = lists[l]; *k && !known; k++) known = !strcmp(key, *k);
        if (!known) return key;
    }
    return NULL;
}

/* ------------------------------------------------------------------ /v1/models */

char *srv_api_models_json(const char *model_name, long long created, int ctx, bool one, size_t *len)
{
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", model_name, "object", "model", "created",
                          (json_int_t)created, "owned_by", "dsv4", "max_model_len", ctx);
    json_t *o = one || !m ? m : json_pack("{s:s, s:[o]}", "object", "list", "data", m);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s && len) *len = strlen(s);
    return s;
}
