/*
 * api_openai.c - the OpenAI dialect: POST /v1/chat/completions and /v1/completions, bodies
 * validated field by field into a generation request, and answers written as OpenAI's
 * chat.completion / text_completion objects or their SSE chunks (with logprobs, usage and
 * several choices, "n").
 *
 * Validation rules: a field that is absent or null takes its default; a field of the
 * wrong type or out of range is a 400 whose message names it (and "param" says which);
 * features dsv4 does not implement (echo, best_of, suffix) are refused with 400 rather than
 * silently ignored, so a client never gets output it did not ask for. For the same reason an
 * unknown top-level field is a 400 naming it, as OpenAI's API does (a "grammar" or "mirostat"
 * that silently did nothing would be a wrong answer); only a short allow-list of fields that
 * SDKs send and that cannot change the output (user, metadata, store, ...) is accepted and
 * ignored.
 *
 * Chat prompts: the messages are already the V4 chat document's; tools, and a
 * response_format hint, go on a leading system message (request_chat.c does the rest).
 * Thinking mode comes from reasoning_effort or chat_template_kwargs.thinking. Sampling,
 * stop strings and the max_tokens rule are the request core's (request.c).
 *
 * Everything here runs on connection threads and touches only the request and immutable
 * objects (the tokenizer).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/api.h"

/* ------------------------------------------------------------------ requests */

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
        srv_api_param(e, key);
        e->code = "unknown_parameter";
        return -1;
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
    static const struct srv_sampling_spec spec = { .temp_max = 2, .top_k_min = -1 };
    long long n = 1;
    if (refuse_unsupported(o, e) || srv_req_sampling(c, o, &spec, g, e) || srv_json_int(o, "n", 1, SRV_MAX_N, &n, e))
        return -1;
    g->n = (int)n;
    if (srv_json_bool(o, "stream", &g->stream, e)) return -1;
    json_t *so = srv_json_field(o, "stream_options");
    if (so && !json_is_object(so)) return srv_api_fail(e, 400, "stream_options", "'stream_options' must be an object");
    if (so && srv_json_bool(so, "include_usage", &g->include_usage, e)) return -1;
    if (srv_json_bool(o, "return_tokens_as_token_ids", &g->ids_as_text, e) || srv_json_bool(o, "ignore_eos", &g->ignore_eos, e))
        return -1;
    bool skip_special = true;
    if (srv_json_bool(o, "skip_special_tokens", &skip_special, e)) return -1;
    g->keep_special = !skip_special;
    if (srv_req_speculative(o, g, e)) return -1;
    return srv_req_stop(o, "stop", true, g, e);
}


/* max_tokens (or max_completion_tokens) by the core's rule; a prompt that leaves no room
 * is a 400 in OpenAI's words. */
static int limit(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, long long dflt, struct srv_api_error *e)
{
    long long mt = -1, mct = -1;
    if (srv_json_int(o, "max_tokens", 1, INT32_MAX, &mt, e) || srv_json_int(o, "max_completion_tokens", 1, INT32_MAX, &mct, e))
        return -1;
    if (mct > 0) mt = mct;
    int rc = srv_req_limit(c, mt, mct > 0 ? "max_completion_tokens" : "max_tokens", dflt, g, e);
    if (rc != SRV_REQ_NO_ROOM) return rc;
    const char *what = g->kind == SRV_API_CHAT ? "messages" : "prompt";
    srv_api_fail(e, 400, what,
                 "This model's maximum context length is %d tokens; the %s has %d tokens, which leaves no room "
                 "for a completion",
                 c->ctx, what, g->n_prompt);
    e->code = "context_length_exceeded";
    return -1;
}

/* tool_choice: none (the tools are not offered), auto, required or a named function. */
static int tool_choice(json_t *o, struct srv_chat *ch, struct srv_api_error *e)
{
    json_t *tc = srv_json_field(o, "tool_choice");
    if (tc) {
        const char *s = json_string_value(tc);
        if (!s && !json_is_object(tc))
            return srv_api_fail(e, 400, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (!s) {
            const char *type = json_string_value(json_object_get(tc, "type"));
            ch->forced = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!type || strcmp(type, "function") || !ch->forced)
                return srv_api_fail(e, 400, "tool_choice", "a tool_choice object must be {\"type\": \"function\", "
                                    "\"function\": {\"name\": ...}}");
            ch->force = true;
        } else if (!strcmp(s, "required")) {
            ch->force = true;
        } else if (strcmp(s, "none") && strcmp(s, "auto")) {
            return srv_api_fail(e, 400, "tool_choice", "'tool_choice' is \"%s\"; use none, auto or required", s);
        }
        if (!strcmp(s ? s : "", "none")) json_decref(ch->tools), ch->tools = NULL;
    }
    if (ch->tools && json_array_size(ch->tools) == 0) json_decref(ch->tools), ch->tools = NULL;
    if (ch->force && !ch->tools)
        return srv_api_fail(e, 400, "tool_choice", "'tool_choice' forces a call but no tools are given");
    if (ch->forced && !srv_req_has_tool(ch->tools, ch->forced))
        return srv_api_fail(e, 400, "tool_choice", "tool_choice names '%s', which is not in 'tools'", ch->forced);
    return 0;
}

/* Thinking control: reasoning_effort, chat_template_kwargs {reasoning_effort, thinking,
 * enable_thinking}. */
static int thinking(json_t *o, struct dsv4_chat_params *cp, struct srv_api_error *e)
{
    if (srv_req_effort(srv_json_field(o, "reasoning_effort"), "reasoning_effort", "reasoning_effort", cp, e)) return -1;
    json_t *kw = srv_json_field(o, "chat_template_kwargs");
    if (kw && !json_is_object(kw))
        return srv_api_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (!kw) return 0;
    if (srv_req_effort(srv_json_field(kw, "reasoning_effort"), "chat_template_kwargs.reasoning_effort",
                       "chat_template_kwargs.reasoning_effort", cp, e))
        return -1;
    static const char *const keys[] = { "thinking", "enable_thinking" };
    for (int k = 0; k < 2; k++) {
        json_t *t = srv_json_field(kw, keys[k]);
        if (t && !json_is_boolean(t))
            return srv_api_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs.%s' must be a boolean", keys[k]);
        if (t) cp->mode = json_is_true(t) ? DSV4_CHAT_MODE_THINKING : DSV4_CHAT_MODE_CHAT;
    }
    return 0;
}

/* messages, logprobs and top_logprobs. */
static int messages(json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
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
    return 0;
}

static int chat_doc(json_t *o, struct srv_chat *ch, struct srv_gen *g, struct srv_api_error *e)
{
    if (messages(o, g, e) || thinking(o, &ch->cp, e)) return -1;
    g->mode       = ch->cp.mode;
    json_t *tools = srv_json_field(o, "tools");
    if (tools && check_tools(tools, e)) return -1;
    ch->tools = json_incref(tools);
    if (tool_choice(o, ch, e)) return -1;
    json_t *rf = srv_json_field(o, "response_format");
    if (rf) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !type)
            return srv_api_fail(e, 400, "response_format", "'response_format' must be an object with a \"type\"");
        if (!strcmp(type, "text")) rf = NULL;
        else if (strcmp(type, "json_object") && strcmp(type, "json_schema"))
            return srv_api_fail(e, 400, "response_format", "response_format type \"%s\" is not supported", type);
    }
    ch->format       = rf;
    ch->format_param = "response_format";
    ch->messages     = json_copy(srv_json_field(o, "messages"));
    if (!ch->messages) return srv_api_fail(e, 500, NULL, "out of memory");
    json_t *first = ch->tools || rf ? srv_req_lead_system(ch->messages) : NULL;
    if ((ch->tools || rf) && !first) return srv_api_fail(e, 500, NULL, "out of memory");
    if (rf) json_object_set(first, "response_format", rf); /* the encoding's format hint */
    return 0;
}

static int parse_chat(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    if (refuse_unknown(o, g->kind, e) || parse_common(c, o, g, e)) return -1;
    if (!c->tok)
        return srv_api_fail(e, 400, NULL,
                            "this model has no tokenizer.json, so it cannot chat: use /v1/completions with token ids");
    struct srv_chat ch;
    srv_chat_init(&ch);
    int rc = chat_doc(o, &ch, g, e);
    if (!rc) rc = srv_req_chat(c, &ch, false, g, e);
    srv_chat_free(&ch);
    return rc ? -1 : limit(c, o, g, 0, e);
}

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
    if (refuse_unknown(o, g->kind, e) || parse_common(c, o, g, e)) return -1;
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
    return limit(c, o, g, c->default_max_tokens_completions, e);
}


/* ------------------------------------------------------------------ answers */

/* Log-probabilities are finite in JSON (the clamp vLLM uses). */
static json_t *jlogprob(float lp)
{
    return json_real(isfinite(lp) ? (double)lp : -9999.0);
}

static void sse_data(struct srv_buf *sse, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return;
    srv_buf_puts(sse, "data: ");
    srv_buf_puts(sse, s);
    srv_buf_puts(sse, "\n\n");
    free(s);
}

static json_t *new_lp(const struct srv_out *o)
{
    if (!o->logprobs) return NULL;
    if (o->kind == SRV_API_CHAT) return json_array();
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* A fresh logprobs delta (the entries written go with their chunk). */
static void clear_lp(struct srv_out *o)
{
    if (o->lp) {
        json_decref(o->lp);
        o->lp = new_lp(o);
    }
    if (o->ids) json_array_clear(o->ids);
}

static int open_out(struct srv_out *o, const struct srv_gen *g, const struct srv_api_ctx *c)
{
    (void)g;
    (void)c;
    o->lp  = new_lp(o);
    o->ids = o->token_ids ? json_array() : NULL;
    return (o->logprobs && !o->lp) || (o->token_ids && !o->ids) ? -1 : 0;
}

static void close_out(struct srv_out *o)
{
    json_decref(o->lp);
    json_decref(o->ids);
}

/* The text of one token for logprobs: "token_id:N", or its bytes (repaired to UTF-8). */
static json_t *token_json(const struct srv_out *o, int32_t id, json_t **bytes)
{
    char   buf[512];
    size_t n = 0;
    if (bytes) *bytes = NULL;
    if (o->ids_as_text || !o->tok || dsv4_tokenizer_decode(o->tok, &id, 1, buf, sizeof(buf), &n, NULL)) {
        snprintf(buf, sizeof(buf), "token_id:%d", (int)id);
        n = strlen(buf);
        if (bytes && o->tok && !o->ids_as_text) *bytes = json_null();
    }
    if (bytes && !*bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)buf[i]));
    }
    return srv_json_str(buf, n);
}

static void logprob(struct srv_out *o, const struct srv_token *t)
{
    if (o->kind == SRV_API_CHAT) {
        json_t *bytes, *tok = token_json(o, t->id, &bytes);
        json_t *top = json_array();
        for (int k = 0; k < t->n_top; k++) {
            json_t *tb, *tt = token_json(o, t->top_id[k], &tb);
            json_array_append_new(top, json_pack("{s:o, s:o, s:o}", "token", tt, "logprob", jlogprob(t->top_lp[k]),
                                                 "bytes", tb));
        }
        json_array_append_new(o->lp, json_pack("{s:o, s:o, s:o, s:o}", "token", tok, "logprob", jlogprob(t->logprob),
                                               "bytes", bytes, "top_logprobs", top));
        return;
    }
    json_t *top = json_object();
    for (int k = 0; k < t->n_top; k++) {
        json_t *tt = token_json(o, t->top_id[k], NULL);
        json_object_set_new(top, json_string_value(tt), jlogprob(t->top_lp[k]));
        json_decref(tt);
    }
    json_t *tok = token_json(o, t->id, NULL);
    json_array_append_new(json_object_get(o->lp, "tokens"), tok);
    json_array_append_new(json_object_get(o->lp, "token_logprobs"), jlogprob(t->logprob));
    json_array_append_new(json_object_get(o->lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(o->lp, "text_offset"), json_integer((json_int_t)o->text_off));
    char   buf[512];
    size_t n = 0;
    if (o->tok && dsv4_tokenizer_decode(o->tok, &t->id, 1, buf, sizeof(buf), &n, NULL) == DSV4_OK) o->text_off += n;
}

static bool delta_empty(const struct srv_out *o)
{
    return o->content.len == 0 && o->reasoning.len == 0 && json_array_size(o->calls) == 0 &&
           (!o->lp || (o->kind == SRV_API_CHAT ? json_array_size(o->lp) == 0
                                               : json_array_size(json_object_get(o->lp, "tokens")) == 0)) &&
           (!o->ids || json_array_size(o->ids) == 0);
}

static json_t *chunk_head(const struct srv_out *o)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", o->id, "object",
                     o->kind == SRV_API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)o->created, "model", o->model);
}

/* One SSE chunk with the pending delta (and finish_reason when given); skipped when there
 * is nothing to say. */
static void chunk(struct srv_out *o, struct srv_buf *sse, const char *finish)
{
    if (!finish && delta_empty(o)) return;
    json_t *choice = json_pack("{s:i}", "index", o->choice);
    if (o->kind == SRV_API_CHAT) {
        json_t *delta = json_object();
        if (o->reasoning.len) json_object_set_new(delta, "reasoning_content", srv_json_buf(&o->reasoning));
        if (o->content.len) json_object_set_new(delta, "content", srv_json_buf(&o->content));
        if (json_array_size(o->calls)) json_object_set(delta, "tool_calls", o->calls);
        json_object_set_new(choice, "delta", delta);
        json_object_set_new(choice, "logprobs",
                            o->lp && json_array_size(o->lp) ? json_pack("{s:O}", "content", o->lp) : json_null());
    } else {
        json_object_set_new(choice, "text", srv_json_buf(&o->content));
        json_object_set_new(choice, "logprobs",
                            o->lp && json_array_size(json_object_get(o->lp, "tokens")) ? json_copy(o->lp) : json_null());
        if (o->ids) json_object_set(choice, "token_ids", o->ids);
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *c = chunk_head(o);
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    if (o->include_usage) json_object_set_new(c, "usage", json_null());
    sse_data(sse, c);
    srv_out_clear_delta(o);
    clear_lp(o);
}


static void delta(struct srv_out *o, struct srv_buf *sse)
{
    chunk(o, sse, NULL);
}

/* Streaming chat: the opening chunk gives the role (completions have none). */
static void begin(struct srv_out *o, struct srv_buf *sse)
{
    if (o->kind != SRV_API_CHAT) return;
    json_t *c = chunk_head(o);
    json_object_set_new(c, "choices",
                        json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", o->choice, "delta", "role", "assistant", "content",
                                  "", "logprobs", "finish_reason"));
    if (o->include_usage) json_object_set_new(c, "usage", json_null());
    sse_data(sse, c);
}

static json_t *usage_json(const struct srv_out *o, int n_cached)
{
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", o->n_prompt, "completion_tokens", o->n_tok,
                     "total_tokens", o->n_prompt + o->n_tok, "prompt_tokens_details", "cached_tokens", n_cached);
}

static json_t *final_body(struct srv_out *o, const char *finish, int n_cached)
{
    json_t *choice = json_pack("{s:i}", "index", o->choice);
    if (o->kind == SRV_API_CHAT) {
        json_t *msg = json_pack("{s:s}", "role", "assistant");
        bool    calls = json_array_size(o->calls) > 0;
        json_object_set_new(msg, "content", calls && o->content.len == 0 ? json_null() : srv_json_buf(&o->content));
        if (o->reasoning.len) json_object_set_new(msg, "reasoning_content", srv_json_buf(&o->reasoning));
        if (calls) json_object_set(msg, "tool_calls", o->calls);
        json_object_set_new(choice, "message", msg);
        json_object_set_new(choice, "logprobs", o->lp ? json_pack("{s:O}", "content", o->lp) : json_null());
    } else {
        json_object_set_new(choice, "text", srv_json_buf(&o->content));
        json_object_set_new(choice, "logprobs", o->lp ? json_incref(o->lp) : json_null());
        if (o->ids) json_object_set(choice, "token_ids", o->ids);
    }
    json_object_set_new(choice, "finish_reason", json_string(finish));
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", o->id, "object",
                     o->kind == SRV_API_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)o->created,
                     "model", o->model, "choices", choice, "usage", usage_json(o, n_cached));
}

static int end(struct srv_out *o, const struct srv_api_error *e, const char *finish, int n_cached,
               struct srv_buf *sse, struct srv_buf *body)
{
    if (!o->stream) return srv_out_body(o, e ? NULL : final_body(o, finish, n_cached), e, body);
    if (e) {
        chunk(o, sse, NULL);
        size_t n;
        char  *ej = srv_api_error_json(e, &n);
        if (ej) srv_buf_printf(sse, "data: %s\n\n", ej);
        free(ej);
    } else {
        chunk(o, sse, finish);
        if (o->include_usage && o->n_choices <= 1) {
            json_t *c = chunk_head(o);
            json_object_set_new(c, "choices", json_array());
            json_object_set_new(c, "usage", usage_json(o, n_cached));
            sse_data(sse, c);
        }
    }
    if (o->n_choices <= 1) srv_buf_puts(sse, "data: [DONE]\n\n"); /* several: end_choices ends */
    return 200;
}

/* Several choices, all ended: streaming, the summed usage and [DONE]; whole, one body (the
 * first's, with every choice and the usage summed), or the first error. */
static int end_choices(struct srv_out **outs, int n, const struct srv_buf *parts, int status, int failed,
                       int completion, int n_cached, struct srv_buf *sse, struct srv_buf *body)
{
    const struct srv_out *o0 = outs[0];
    if (sse) {
        if (o0->include_usage) {
            json_t *c = chunk_head(o0);
            json_object_set_new(c, "choices", json_array());
            json_object_set_new(c, "usage", json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", o0->n_prompt,
                                                      "completion_tokens", completion, "total_tokens",
                                                      o0->n_prompt + completion, "prompt_tokens_details",
                                                      "cached_tokens", n_cached));
            sse_data(sse, c);
        }
        srv_buf_puts(sse, "data: [DONE]\n\n");
        return 200;
    }
    /* one body: the first's, with every choice; an error body if any choice failed */
    json_t *merged = NULL;
    for (int i = 0; i < n && status == 200; i++) {
        json_t *b = json_loadb(parts[i].p ? parts[i].p : "", parts[i].len, 0, NULL);
        if (!b) status = 500, failed = -1;
        else if (!merged) merged = b;
        else {
            json_array_extend(json_object_get(merged, "choices"), json_object_get(b, "choices"));
            json_decref(b);
        }
    }
    if (status == 200 && merged) {
        json_t *u = json_object_get(merged, "usage");
        json_object_set_new(u, "completion_tokens", json_integer(completion));
        json_object_set_new(u, "total_tokens", json_integer(o0->n_prompt + completion));
        char *text = json_dumps(merged, JSON_COMPACT);
        if (text) srv_buf_puts(body, text);
        else status = 500;
        free(text);
    } else {
        if (failed >= 0) srv_buf_put(body, parts[failed].p ? parts[failed].p : "", parts[failed].len); /* its error */
        if (!body->len) {
            struct srv_api_error e;
            size_t               k;
            srv_api_fail(&e, 500, NULL, "building the response failed");
            char *ej = srv_api_error_json(&e, &k);
            if (ej) srv_buf_put(body, ej, k);
            free(ej);
        }
    }
    json_decref(merged);
    return status;
}

/* ------------------------------------------------------------------ the dialects */

const struct srv_dialect srv_dialect_chat = {
    .id_prefix = "chatcmpl-", .call_prefix = "call_", .parse = parse_chat, .open = open_out, .close = close_out,
    .begin = begin, .logprob = logprob, .delta = delta, .end = end, .error = srv_api_error_json,
    .end_choices = end_choices,
};

const struct srv_dialect srv_dialect_completion = {
    .id_prefix = "cmpl-", .call_prefix = "call_", .parse = parse_completion, .open = open_out, .close = close_out,
    .begin = begin, .logprob = logprob, .delta = delta, .end = end, .error = srv_api_error_json,
    .end_choices = end_choices,
};
