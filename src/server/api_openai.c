/*
 * api_openai.c - OpenAI-compatible requests: POST /v1/chat/completions and /v1/completions
 * bodies parsed with jansson, validated field by field, and turned into a generation
 * request (prompt ids, sampling, limits); plus the error shape and GET /v1/models.
 *
 * Validation rules: a field that is absent or null takes its default; a field of the
 * wrong type or out of range is a 400 whose message names it (and "param" says which);
 * features dsv4 does not implement (echo, best_of, suffix) are refused with 400 rather than silently ignored, so a client
 * never gets output it did not ask for. For the same reason an unknown top-level field is a
 * 400 naming it, as OpenAI's API does (a "grammar" or "mirostat" that silently did nothing
 * would be a wrong answer); only a short allow-list of fields that SDKs send and that cannot
 * change the output (user, metadata, store, ...) is accepted and ignored.
 *
 * Chat prompts: the messages go through dsv4_chat_render_json (the DeepSeek-V4 encoding);
 * tools, and a response_format hint, are attached to a system message (an empty one is put
 * first when the conversation has none, since the encoding renders tools only there).
 * Thinking mode comes from reasoning_effort or chat_template_kwargs.thinking.
 *
 * Everything here runs on connection threads and touches only the request and immutable
 * objects (the tokenizer).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "server/server.h"

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

/* ------------------------------------------------------------------ small helpers */

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

/* ------------------------------------------------------------------ known fields */

/* Read by the parsers below (both endpoints, or the one named). */
static const char *const FIELDS_COMMON[] = {
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "stream", "stream_options", "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
    "return_tokens_as_token_ids", "ignore_eos", "skip_special_tokens", "logprobs", "speculative", NULL,
};
static const char *const FIELDS_CHAT[] = {
    "messages", "top_logprobs", "tools", "tool_choice", "reasoning_effort", "chat_template_kwargs", "response_format", NULL,
};
static const char *const FIELDS_COMPLETION[] = { "prompt", "echo", "best_of", "suffix", "return_token_ids", NULL };
/* Sent by common clients, without effect on the output: accepted and ignored (docs/SERVER.md). */
static const char *const FIELDS_IGNORED[] = {
    "user", "metadata", "store", "parallel_tool_calls", "service_tier", "safety_identifier", "prompt_cache_key", NULL,
};

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

static int refuse_unknown(json_t *o, enum srv_api_kind kind, struct srv_api_error *e)
{
    const char *const *lists[] = { FIELDS_COMMON, FIELDS_IGNORED, kind == SRV_API_CHAT ? FIELDS_CHAT : FIELDS_COMPLETION };
    const char        *key     = srv_json_unknown_key(o, lists, 3);
    if (key) {
        /* the name is copied: the request's JSON is freed before the error is written */
        if (!strcmp(key, "functions") || !strcmp(key, "function_call"))
            srv_api_fail(e, 400, NULL, "the legacy '%s' field is not supported by dsv4; use 'tools'", key);
        else
            srv_api_fail(e, 400, NULL, "Unrecognized request argument supplied: %s (dsv4 does not implement it; "
                                       "docs/SERVER.md lists the fields it accepts)", key);
        snprintf(e->param_buf, sizeof(e->param_buf), "%s", key);
        e->param = e->param_buf;
        e->code  = "unknown_parameter";
        return -1;
    }
    return 0;
}

/* presence_penalty, frequency_penalty (OpenAI: [-2, 2]), repetition_penalty (vLLM: (0, 2]...
 * taken up to 10) and logit_bias ({"token id": bias in [-100, 100]}, at most 300). */
static int parse_penalties(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    double pp = 0, fp = 0, rp = 1;
    if (srv_json_num(o, "presence_penalty", -2, 2, false, &pp, e) ||
        srv_json_num(o, "frequency_penalty", -2, 2, false, &fp, e) ||
        srv_json_num(o, "repetition_penalty", 0, 10, true, &rp, e))
        return -1;
    g->sp.presence_penalty   = (float)pp;
    g->sp.frequency_penalty  = (float)fp;
    g->sp.repetition_penalty = (float)rp;
    json_t *lb = srv_json_field(o, "logit_bias");
    if (!lb) return 0;
    if (!json_is_object(lb)) return srv_api_fail(e, 400, "logit_bias", "'logit_bias' must be an object {\"token id\": bias}");
    if (json_object_size(lb) > DSV4_MAX_LOGIT_BIAS)
        return srv_api_fail(e, 400, "logit_bias", "'logit_bias' has %zu entries; at most %d", json_object_size(lb),
                            DSV4_MAX_LOGIT_BIAS);
    const char *key;
    json_t     *v;
    json_object_foreach(lb, key, v) {
        char     *end = NULL;
        long long id  = strtoll(key, &end, 10);
        if (!key[0] || *end || id < 0 || id >= c->vocab)
            return srv_api_fail(e, 400, "logit_bias", "logit_bias key '%.40s' is not a token id (0 to %d)", key, c->vocab - 1);
        if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
            return srv_api_fail(e, 400, "logit_bias", "logit_bias[%s] must be a number in [-100, 100]", key);
        g->sp.bias_id[g->sp.n_bias] = (int32_t)id;
        g->sp.bias[g->sp.n_bias++]  = (float)json_number_value(v);
    }
    return 0;
}

/* Fields dsv4 does not implement: accepted only at their neutral values. */
static int refuse_unsupported(json_t *o, struct srv_api_error *e)
{
    long long best_of = 1;
    if (srv_json_int(o, "best_of", 1, 1000000, &best_of, e)) return -1;
    if (best_of != 1) return srv_api_fail(e, 400, "best_of", "'best_of' must be 1");
    bool echo = false;
    if (srv_json_bool(o, "echo", &echo, e)) return -1;
    if (echo) return srv_api_fail(e, 400, "echo", "'echo' is not supported by dsv4");
    if (srv_json_field(o, "suffix")) return srv_api_fail(e, 400, "suffix", "'suffix' is not supported by dsv4");
    return 0;
}

static int parse_stop(json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    json_t *v = srv_json_field(o, "stop");
    if (!v) return 0;
    json_t *one[1] = { v };
    json_t **items = one;
    size_t   n     = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > SRV_MAX_STOP)
            return srv_api_fail(e, 400, "stop", "'stop' has %zu strings; at most %d are supported", n, SRV_MAX_STOP);
        items = NULL;
    } else if (!json_is_string(v)) {
        return srv_api_fail(e, 400, "stop", "'stop' must be a string or an array of strings");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = items ? items[i] : json_array_get(v, i);
        if (!json_is_string(s)) return srv_api_fail(e, 400, "stop", "'stop' must be a string or an array of strings");
        size_t len = json_string_length(s);
        if (len == 0 || len > SRV_MAX_STOP_LEN || strlen(json_string_value(s)) != len)
            return srv_api_fail(e, 400, "stop", "each stop string must have 1 to %d bytes and no NUL", SRV_MAX_STOP_LEN);
        memcpy(g->stop[g->n_stop], json_string_value(s), len + 1);
        g->n_stop++;
    }
    return 0;
}

/* "speculative": {"draft": K}: K tokens drafted by the MTP block per step, 0 = off (absent:
 * the server's --spec-draft); docs/SERVER.md */
int srv_api_speculative(json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    json_t *spec = srv_json_field(o, "speculative");
    if (!spec) return 0;
    long long k = -1;
    if (!json_is_object(spec) || json_object_size(spec) != 1 || !json_object_get(spec, "draft"))
        return srv_api_fail(e, 400, "speculative", "'speculative' must be an object {\"draft\": K}");
    if (srv_json_int(spec, "draft", 0, DSV4_SPEC_MAX_DRAFT, &k, e)) return -1;
    g->spec_draft = k == 0 ? -1 : (int)k;
    return 0;
}

/* Fields common to both endpoints: model, sampling, limits, streaming, stop. */
static int parse_common(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    json_t *model = srv_json_field(o, "model");
    if (model && !json_is_string(model)) return srv_api_fail(e, 400, "model", "'model' must be a string");
    if (model && strcmp(json_string_value(model), c->model_name) != 0) {
        srv_api_fail(e, 400, "model", "The model '%s' does not exist; this server serves '%s'",
                     json_string_value(model), c->model_name);
        e->code = "model_not_found";
        return -1;
    }
    long long n = 1;
    if (refuse_unsupported(o, e) || parse_penalties(c, o, g, e) || srv_json_int(o, "n", 1, SRV_MAX_N, &n, e)) return -1;
    g->n = (int)n;
    double    temp = 1.0, top_p = 1.0, min_p = 0.0;
    long long top_k = 0, seed = 0;
    if (srv_json_num(o, "temperature", 0, 2, false, &temp, e) || srv_json_num(o, "top_p", 0, 1, true, &top_p, e) ||
        srv_json_num(o, "min_p", 0, 1, false, &min_p, e) || srv_json_int(o, "top_k", -1, 1 << 30, &top_k, e))
        return -1;
    g->sp.temperature = (float)temp;
    g->sp.top_p       = (float)top_p;
    g->sp.min_p       = (float)min_p;
    g->sp.top_k       = top_k < 0 ? 0 : (int)top_k;
    if (srv_json_field(o, "seed")) {
        if (srv_json_int(o, "seed", INT64_MIN, INT64_MAX, &seed, e)) return -1;
        g->sp.seed = (uint64_t)seed;
    } else {
        g->sp.seed = srv_random_u64();
    }
    if (srv_json_bool(o, "stream", &g->stream, e)) return -1;
    json_t *so = srv_json_field(o, "stream_options");
    if (so && !json_is_object(so)) return srv_api_fail(e, 400, "stream_options", "'stream_options' must be an object");
    if (so && srv_json_bool(so, "include_usage", &g->include_usage, e)) return -1;
    if (srv_json_bool(o, "return_tokens_as_token_ids", &g->ids_as_text, e) || srv_json_bool(o, "ignore_eos", &g->ignore_eos, e))
        return -1;
    bool skip_special = true;
    if (srv_json_bool(o, "skip_special_tokens", &skip_special, e)) return -1;
    g->keep_special = !skip_special;
    if (srv_api_speculative(o, g, e)) return -1;
    return parse_stop(o, g, e);
}

/* max_tokens against the context: an explicit value that does not fit is a 400 (as
 * OpenAI), an absent one takes dflt, clipped to what fits. */
static int fit_context(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, long long dflt,
                       struct srv_api_error *e)
{
    long long mt = -1, mct = -1;
    if (srv_json_int(o, "max_tokens", 1, INT32_MAX, &mt, e) || srv_json_int(o, "max_completion_tokens", 1, INT32_MAX, &mct, e))
        return -1;
    if (mct > 0) mt = mct;
    const char *what = g->kind == SRV_API_CHAT ? "messages" : "prompt";
    if (g->n_prompt >= c->ctx) {
        srv_api_fail(e, 400, what,
                     "This model's maximum context length is %d tokens; the %s has %d tokens, which leaves no room "
                     "for a completion",
                     c->ctx, what, g->n_prompt);
        e->code = "context_length_exceeded";
        return -1;
    }
    if (mt > 0 && g->n_prompt + mt > c->ctx) {
        srv_api_fail(e, 400, mct > 0 ? "max_completion_tokens" : "max_tokens",
                     "This model's maximum context length is %d tokens; you requested %lld tokens (%d in the %s, "
                     "%lld for the completion)",
                     c->ctx, g->n_prompt + mt, g->n_prompt, what, mt);
        e->code = "context_length_exceeded";
        return -1;
    }
    if (mt < 0) mt = dflt > 0 && dflt < c->ctx - g->n_prompt ? dflt : c->ctx - g->n_prompt;
    g->max_tokens = (int)mt;
    return 0;
}

/* ------------------------------------------------------------------ chat */

static int parse_effort(json_t *v, const char *param, enum dsv4_chat_mode *mode, enum dsv4_chat_effort *effort,
                        struct srv_api_error *e)
{
    if (!v) return 0;
    const char *s = json_string_value(v);
    if (!s) return srv_api_fail(e, 400, param, "'%s' must be a string", param);
    if (!strcmp(s, "none") || !strcmp(s, "minimal")) {
        *mode = DSV4_CHAT_MODE_CHAT;
    } else if (!strcmp(s, "low") || !strcmp(s, "medium")) {
        *mode   = DSV4_CHAT_MODE_THINKING;
        *effort = DSV4_CHAT_EFFORT_DEFAULT;
    } else if (!strcmp(s, "high")) {
        *mode   = DSV4_CHAT_MODE_THINKING;
        *effort = DSV4_CHAT_EFFORT_HIGH;
    } else if (!strcmp(s, "max") || !strcmp(s, "xhigh")) {
        *mode   = DSV4_CHAT_MODE_THINKING;
        *effort = DSV4_CHAT_EFFORT_MAX;
    } else {
        return srv_api_fail(e, 400, param, "'%s' is \"%s\"; use none, low, medium, high or max", param, s);
    }
    return 0;
}

static int check_tools(json_t *tools, struct srv_api_error *e)
{
    if (!json_is_array(tools)) return srv_api_fail(e, 400, "tools", "'tools' must be an array");
    size_t  i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        json_t     *fn   = json_object_get(t, "function");
        if (!json_is_object(t) || !type || strcmp(type, "function") != 0 || !json_is_object(fn))
            return srv_api_fail(e, 400, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
        if (!json_is_string(json_object_get(fn, "name")) || json_string_length(json_object_get(fn, "name")) == 0)
            return srv_api_fail(e, 400, "tools", "tools[%zu].function.name must be a non-empty string", i);
        json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params))
            return srv_api_fail(e, 400, "tools", "tools[%zu].function.parameters must be an object", i);
    }
    return 0;
}

/* The chat document {messages, tools} -> the V4 prompt -> token ids in g (doc is consumed).
 * Message text is tokenized as text (no control token can be typed in) unless the server
 * trusts its callers (--special-tokens-in-messages). */
int srv_api_render(const struct srv_api_ctx *c, json_t *doc, const struct dsv4_chat_params *cp, const char *param,
                   struct srv_gen *g, struct srv_api_error *e)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text) return srv_api_fail(e, 500, NULL, "out of memory");
    char           *prompt  = NULL;
    uint8_t        *literal = NULL;
    size_t          plen    = 0;
    struct dsv4_err err;
    int             rc = c->special_in_messages
                             ? dsv4_chat_render_json(text, strlen(text), cp, &prompt, &plen, &err)
                             : dsv4_chat_render_json_marked(text, strlen(text), cp, &prompt, &plen, &literal, &err);
    free(text);
    if (rc) return srv_api_fail(e, rc == DSV4_ENOMEM ? 500 : 400, param, "%s", err.msg);

    size_t cap = 3 * plen + 1, n = 0;
    g->prompt  = malloc(sizeof(int32_t) * cap);
    if (!g->prompt) {
        free(prompt);
        free(literal);
        return srv_api_fail(e, 500, NULL, "out of memory");
    }
    rc = dsv4_tokenizer_encode_marked(c->tok, prompt, plen, literal, 0, g->prompt, cap, &n, &err);
    free(prompt);
    free(literal);
    if (rc) return srv_api_fail(e, 400, param, "%s", err.msg);
    g->n_prompt   = (int)n;
    g->parse_chat = true;
    g->mode       = cp->mode;
    return 0;
}

/* Forcing a tool call (tool_choice "required" / a named function; Anthropic's any / tool):
 * the assistant turn is begun for the model with the DSML opening of a call, and of its name
 * when one is given, appended to the prompt; srv_out feeds the same text to its DSML parser
 * first, so the call the model completes is parsed as if it had written it all. Thinking
 * mode is refused (the opening would cut the reasoning short, and Anthropic refuses it too).
 * name == NULL: any tool, the model writes the name. */
int srv_api_force_tool(const struct srv_api_ctx *c, struct srv_gen *g, const char *name, const char *param,
                       struct srv_api_error *e)
{
    if (g->mode == DSV4_CHAT_MODE_THINKING)
        return srv_api_fail(e, 400, param, "forcing a tool call cannot be combined with thinking mode");
    static const char head[] = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"";
    size_t hn = strlen(head), nn = name ? strlen(name) : 0, n = hn + nn + (name ? 3 : 0);
    char    *text = malloc(n + 1);
    uint8_t *lit  = calloc(n + 1, 1);
    if (!text || !lit) {
        free(text);
        free(lit);
        return srv_api_fail(e, 500, NULL, "out of memory");
    }
    memcpy(text, head, hn);
    if (name) {
        memcpy(text + hn, name, nn);
        memset(lit + hn, 1, nn); /* the tool's name is text, never a control token */
        memcpy(text + hn + nn, "\">\n", 3);
    }
    text[n] = '\0';
    size_t          cap = 3 * n + 1, k = 0;
    int32_t        *ids = realloc(g->prompt, sizeof(int32_t) * ((size_t)g->n_prompt + cap));
    struct dsv4_err err;
    int             rc = ids ? dsv4_tokenizer_encode_marked(c->tok, text, n, lit, 0, ids + g->n_prompt, cap, &k, &err)
                             : DSV4_ENOMEM;
    free(lit);
    if (ids) g->prompt = ids;
    if (rc) {
        free(text);
        return srv_api_fail(e, rc == DSV4_ENOMEM ? 500 : 400, param, "%s", rc == DSV4_ENOMEM ? "out of memory" : err.msg);
    }
    g->n_prompt += (int)k;
    g->forced = text;
    return 0;
}

int srv_api_constrain(const struct srv_api_ctx *c, json_t *fmt, bool responses, const char *param, struct srv_gen *g,
                      struct srv_api_error *e)
{
    const char *type   = json_string_value(json_object_get(fmt, "type"));
    json_t     *schema = NULL;
    if (!type || !strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_schema")) {
        schema = responses ? json_object_get(fmt, "schema") : json_object_get(json_object_get(fmt, "json_schema"), "schema");
        if (!json_is_object(schema))
            return srv_api_fail(e, 400, param, "%s: a json_schema format needs %s as an object", param,
                                responses ? "'schema'" : "'json_schema.schema'");
    } else if (strcmp(type, "json_object")) {
        return srv_api_fail(e, 400, param, "%s type \"%s\" is not supported (text, json_object or json_schema)", param,
                            type);
    }
    if (!c->json_vocab) return srv_api_fail(e, 500, param, "constrained output is not available (no JSON vocabulary)");
    char           *text  = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
    struct dsv4_err err;
    int32_t         think = -1;
    if (g->mode == DSV4_CHAT_MODE_THINKING && dsv4_tokenizer_token_id(c->tok, "</think>", &think, NULL)) think = -1;
    int rc = (schema && !text) ? DSV4_ENOMEM
                               : dsv4_constraint_new_json(&g->constraint, c->json_vocab, c->tok, text,
                                                          text ? strlen(text) : 0, think, &err);
    free(text);
    if (rc) return srv_api_fail(e, rc == DSV4_ENOMEM ? 500 : 400, param, "%s: %s", param,
                                rc == DSV4_ENOMEM ? "out of memory" : err.msg);
    return 0;
}

int srv_api_strict_call(const struct srv_api_ctx *c, json_t *tools, bool forced, const char *name, struct srv_gen *g,
                        struct srv_api_error *e)
{
    if (g->constraint) return 0; /* a response format (or a thinking budget) is constrained already */
    json_t *list = json_array();
    size_t  i;
    json_t *t;
    bool    all_strict = true;
    json_array_foreach(tools, i, t) {
        json_t     *fn = json_object_get(t, "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (name && (!nm || strcmp(nm, name))) continue;
        if (!json_is_true(json_object_get(fn, "strict"))) all_strict = false;
        json_array_append_new(list, json_pack("{s:s, s:O?}", "name", nm ? nm : "", "parameters",
                                              json_object_get(fn, "parameters")));
    }
    int rc = 0;
    if (all_strict && json_array_size(list)) {
        if (!c->json_vocab) {
            json_decref(list);
            return srv_api_fail(e, 500, "tools", "strict tool calls are not available (no JSON vocabulary)");
        }
        char           *text = json_dumps(list, JSON_COMPACT);
        struct dsv4_err err;
        int32_t         think = -1;
        if (g->mode == DSV4_CHAT_MODE_THINKING && dsv4_tokenizer_token_id(c->tok, "</think>", &think, NULL)) think = -1;
        rc = !text   ? DSV4_ENOMEM
             : forced ? dsv4_constraint_new_call(&g->constraint, c->json_vocab, c->tok, text, strlen(text), name, &err)
                      : dsv4_constraint_new_tools(&g->constraint, c->json_vocab, c->tok, text, strlen(text), think, &err);
        free(text);
        if (rc) srv_api_fail(e, rc == DSV4_ENOMEM ? 500 : 400, "tools", "strict tools: %s",
                             rc == DSV4_ENOMEM ? "out of memory" : err.msg);
    }
    json_decref(list);
    return rc ? -1 : 0;
}

/* Whether the function tools offer name. */
bool srv_api_has_tool(json_t *tools, const char *name)
{
    size_t  i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && !strcmp(n, name)) return true;
    }
    return false;
}

static int parse_chat(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    if (!c->tok)
        return srv_api_fail(e, 400, NULL,
                            "this model has no tokenizer.json, so it cannot chat: use /v1/completions with token ids");
    json_t *msgs = srv_json_field(o, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return srv_api_fail(e, 400, "messages", "'messages' must be a non-empty array of messages");
    size_t  i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) return srv_api_fail(e, 400, "messages", "messages[%zu] must be an object", i);
        if (!json_is_string(json_object_get(m, "role")))
            return srv_api_fail(e, 400, "messages", "messages[%zu].role must be a string", i);
    }
    bool      logprobs = false;
    long long top      = 0;
    if (srv_json_bool(o, "logprobs", &logprobs, e) || srv_json_int(o, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &top, e))
        return -1;
    if (srv_json_field(o, "top_logprobs") && !logprobs)
        return srv_api_fail(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    g->logprobs     = logprobs;
    g->top_logprobs = (int)top;

    /* thinking control */
    struct dsv4_chat_params cp;
    dsv4_chat_params_default(&cp);
    if (parse_effort(srv_json_field(o, "reasoning_effort"), "reasoning_effort", &cp.mode, &cp.effort, e)) return -1;
    json_t *kw = srv_json_field(o, "chat_template_kwargs");
    if (kw && !json_is_object(kw))
        return srv_api_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (kw) {
        if (parse_effort(srv_json_field(kw, "reasoning_effort"), "chat_template_kwargs.reasoning_effort", &cp.mode, &cp.effort,
                         e))
            return -1;
        static const char *const keys[] = { "thinking", "enable_thinking" };
        for (int k = 0; k < 2; k++) {
            json_t *t = srv_json_field(kw, keys[k]);
            if (t && !json_is_boolean(t))
                return srv_api_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs.%s' must be a boolean",
                                    keys[k]);
            if (t) cp.mode = json_is_true(t) ? DSV4_CHAT_MODE_THINKING : DSV4_CHAT_MODE_CHAT;
        }
    }
    g->mode = cp.mode;

    /* tools */
    json_t *tools = srv_json_field(o, "tools");
    if (tools && check_tools(tools, e)) return -1;
    json_t     *tc     = srv_json_field(o, "tool_choice");
    bool        force  = false;
    const char *forced = NULL; /* the function forced by name */
    if (tc) {
        const char *s = json_string_value(tc);
        if (!s && !json_is_object(tc))
            return srv_api_fail(e, 400, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (!s) {
            const char *type = json_string_value(json_object_get(tc, "type"));
            forced = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!type || strcmp(type, "function") || !forced)
                return srv_api_fail(e, 400, "tool_choice", "a tool_choice object must be {\"type\": \"function\", "
                                    "\"function\": {\"name\": ...}}");
            force = true;
        } else if (!strcmp(s, "required")) {
            force = true;
        } else if (strcmp(s, "none") && strcmp(s, "auto")) {
            return srv_api_fail(e, 400, "tool_choice", "'tool_choice' is \"%s\"; use none, auto or required", s);
        }
        if (!strcmp(s ? s : "", "none")) tools = NULL;
    }
    if (tools && json_array_size(tools) == 0) tools = NULL;
    if (force && !tools) return srv_api_fail(e, 400, "tool_choice", "'tool_choice' forces a call but no tools are given");
    if (forced && !srv_api_has_tool(tools, forced))
        return srv_api_fail(e, 400, "tool_choice", "tool_choice names '%s', which is not in 'tools'", forced);
    g->tools = tools != NULL;
    json_t *rf = srv_json_field(o, "response_format");
    if (rf) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !type)
            return srv_api_fail(e, 400, "response_format", "'response_format' must be an object with a \"type\"");
        if (!strcmp(type, "text")) rf = NULL;
        else if (strcmp(type, "json_object") && strcmp(type, "json_schema"))
            return srv_api_fail(e, 400, "response_format", "response_format type \"%s\" is not supported", type);
    }

    /* The document for the renderer: tools and the format hint on a leading system message. */
    json_t *list = json_copy(msgs), *doc = NULL;
    if (!list) return srv_api_fail(e, 500, NULL, "out of memory");
    if (tools || rf) {
        const char *role0 = json_string_value(json_object_get(json_array_get(list, 0), "role"));
        json_t     *first = json_array_get(list, 0);
        if (strcmp(role0, "system") != 0 && strcmp(role0, "developer") != 0) {
            first = json_pack("{s:s, s:s}", "role", "system", "content", "");
            json_array_insert_new(list, 0, first);
        } else {
            first = json_copy(first); /* shallow: do not change the request's own message */
            json_array_set_new(list, 0, first);
        }
        if (rf) json_object_set(first, "response_format", rf);
    }
    doc = json_pack("{s:o}", "messages", list);
    if (doc && tools) json_object_set(doc, "tools", tools);
    if (srv_api_render(c, doc, &cp, "messages", g, e)) return -1;
    if (force && srv_api_force_tool(c, g, forced, "tool_choice", e)) return -1;
    if (rf && force)
        return srv_api_fail(e, 400, "response_format", "'response_format' and a forced tool call cannot be combined");
    if (rf && srv_api_constrain(c, rf, false, "response_format", g, e)) return -1;
    if (tools && c->json_vocab && srv_api_strict_call(c, tools, force, forced, g, e)) return -1;
    return fit_context(c, o, g, 0, e);
}

/* ------------------------------------------------------------------ completions */

static int prompt_ids(const struct srv_api_ctx *c, json_t *arr, struct srv_gen *g, struct srv_api_error *e)
{
    size_t n = json_array_size(arr);
    if (n == 0) return srv_api_fail(e, 400, "prompt", "'prompt' is empty");
    g->prompt = malloc(sizeof(int32_t) * n);
    if (!g->prompt) return srv_api_fail(e, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v)) return srv_api_fail(e, 400, "prompt", "prompt[%zu] is not an integer token id", i);
        long long id = json_integer_value(v);
        if (id < 0 || id >= c->vocab)
            return srv_api_fail(e, 400, "prompt", "prompt[%zu] = %lld is not a token id (0 to %d)", i, id, c->vocab - 1);
        g->prompt[i] = (int32_t)id;
    }
    g->n_prompt = (int)n;
    return 0;
}

static int parse_completion(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    json_t *p = srv_json_field(o, "prompt");
    if (!p) return srv_api_fail(e, 400, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) > 0 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
        if (json_array_size(p) != 1)
            return srv_api_fail(e, 400, "prompt", "'prompt' holds %zu prompts; dsv4 takes one per request",
                                json_array_size(p));
        p = json_array_get(p, 0);
    }
    if (json_is_string(p)) {
        if (!c->tok)
            return srv_api_fail(e, 400, "prompt",
                                "this model has no tokenizer.json: send the prompt as an array of token ids");
        size_t len = json_string_length(p), cap = 3 * len + 1, n = 0;
        if (len == 0) return srv_api_fail(e, 400, "prompt", "'prompt' is empty");
        g->prompt = malloc(sizeof(int32_t) * cap);
        if (!g->prompt) return srv_api_fail(e, 500, NULL, "out of memory");
        struct dsv4_err err;
        if (dsv4_tokenizer_encode(c->tok, json_string_value(p), len, 0, g->prompt, cap, &n, &err))
            return srv_api_fail(e, 400, "prompt", "%s", err.msg);
        g->n_prompt = (int)n;
        if (n == 0) return srv_api_fail(e, 400, "prompt", "'prompt' encodes to no tokens");
    } else if (json_is_array(p)) {
        if (prompt_ids(c, p, g, e)) return -1;
    } else {
        return srv_api_fail(e, 400, "prompt", "'prompt' must be a string or an array of token ids");
    }
    json_t *lp = srv_json_field(o, "logprobs");
    if (lp) {
        if (!json_is_integer(lp) || json_integer_value(lp) < 0 || json_integer_value(lp) > SRV_MAX_TOP_LOGPROBS)
            return srv_api_fail(e, 400, "logprobs", "'logprobs' must be an integer from 0 to %d", SRV_MAX_TOP_LOGPROBS);
        g->logprobs     = true;
        g->top_logprobs = (int)json_integer_value(lp);
    }
    g->token_ids = c->tok == NULL;
    if (srv_json_bool(o, "return_token_ids", &g->token_ids, e)) return -1;
    if (!c->tok) g->token_ids = true;
    return fit_context(c, o, g, c->default_max_tokens_completions, e);
}

/* ------------------------------------------------------------------ entry points */

int srv_api_parse(const struct srv_api_ctx *c, enum srv_api_kind kind, const char *body, size_t len,
                  struct srv_gen *g, struct srv_api_error *e)
{
    memset(g, 0, sizeof(*g));
    g->kind    = kind;
    g->created = (long long)time(NULL);
    dsv4_sampler_params_default(&g->sp);
    srv_api_make_id(g->id, sizeof(g->id), kind == SRV_API_CHAT         ? "chatcmpl-"
                                          : kind == SRV_API_COMPLETION ? "cmpl-"
                                          : kind == SRV_API_RESPONSES  ? "resp_"
                                                                       : "msg_");
    int depth = srv_json_depth(body, len);
    if (depth > c->max_json_depth)
        return srv_api_fail(e, 400, NULL, "the JSON body nests %d levels deep; the limit is %d", depth,
                            c->max_json_depth);
    json_error_t jerr;
    json_t      *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return srv_api_fail(e, 400, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                            jerr.column);
    int rc;
    if (!json_is_object(o)) rc = srv_api_fail(e, 400, NULL, "the body must be a JSON object");
    else if (kind == SRV_API_MESSAGES || kind == SRV_API_COUNT) rc = srv_anth_parse(c, o, g, e);
    else if (kind == SRV_API_RESPONSES) rc = srv_resp_parse(c, o, g, e);
    else if ((rc = refuse_unknown(o, kind, e)) == 0 && (rc = parse_common(c, o, g, e)) == 0)
        rc = kind == SRV_API_CHAT ? parse_chat(c, o, g, e) : parse_completion(c, o, g, e);
    json_decref(o);
    if (rc) srv_gen_free(g);
    return rc;
}

void srv_gen_free(struct srv_gen *g)
{
    free(g->prompt);
    g->prompt = NULL;
    free(g->forced);
    g->forced = NULL;
    dsv4_constraint_free(g->constraint);
    g->constraint = NULL;
    json_decref(g->conv);
    json_decref(g->echo);
    g->conv = g->echo = NULL;
}

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
