/*
 * api_anthropic.c - the Anthropic Messages API: POST /v1/messages (whole and streamed) and
 * POST /v1/messages/count_tokens. Requests are translated into the same chat document the
 * OpenAI path renders (messages with roles system/user/assistant/tool, reasoning_content,
 * tool_calls with ids, tool results by tool_call_id; tools as functions), so both APIs
 * share one conversation model, one V4 encoding and one prefix cache; only the shapes
 * differ. The output side (message bodies, the SSE event sequence, errors) is built here
 * from what api_output.c's pipeline produced (reasoning, text, whole tool calls).
 *
 * Mapping (docs/SERVER.md, "Anthropic Messages API"):
 *   system (string or text blocks)      -> a leading system message
 *   user text blocks                    -> one user message (blocks joined by "\n\n")
 *   user tool_result blocks             -> tool messages (tool_call_id = tool_use_id), before
 *                                          the user's text, as the API orders them
 *   assistant thinking / text / tool_use -> reasoning_content / content / tool_calls (the
 *                                          input object as the call's JSON arguments)
 *   tools [{name, description, input_schema}] -> [{type: function, function: {...}}]
 *   thinking {type: enabled|adaptive}   -> thinking mode (budget_tokens: at most that many tokens
 *                                          of reasoning, then </think> is forced); disabled or
 *                                          absent -> chat mode
 *   tool_choice any / tool              -> a forced call (request_chat.c; not with thinking)
 * Not supported, refused with a 400 that says so: images and documents, server tools, a
 * trailing assistant message (prefill).
 * max_tokens is required (as the API requires it) and follows the core's rule (request.c).
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/api.h"

/* ------------------------------------------------------------------ errors */

static const char *anth_error_type(int status)
{
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static json_t *anth_error_obj(const struct srv_api_error *e)
{
    json_t *o = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", anth_error_type(e->status),
                          "message", e->msg);
    if (!o) /* the message was not UTF-8 (it quotes client input): say less */
        o = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", anth_error_type(e->status), "message",
                      "invalid request (the detail is not UTF-8)");
    return o;
}

char *srv_anth_error_json(const struct srv_api_error *e, size_t *len)
{
    json_t *o = anth_error_obj(e);
    char   *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s && len) *len = strlen(s);
    return s;
}

/* ------------------------------------------------------------------ requests */

static const char *const FIELDS[] = {
    "model",  "messages",    "system", "max_tokens", "stop_sequences", "stream",      "temperature",
    "top_p",  "top_k",       "tools",  "tool_choice", "thinking",      "speculative", NULL,
};
/* Sent by clients, without effect on the output here: accepted and ignored. */
static const char *const FIELDS_IGNORED[] = { "metadata", "service_tier", NULL };

static int refuse_unknown(json_t *o, struct srv_api_error *e)
{
    const char *const *lists[] = { FIELDS, FIELDS_IGNORED };
    const char        *key     = srv_json_unknown_key(o, lists, 2);
    if (!key) return 0;
    srv_api_fail(e, 400, NULL, "%s: Extra inputs are not permitted (dsv4 does not implement it; docs/SERVER.md lists "
                               "the fields it accepts)", key);
    srv_api_param(e, key);
    return -1;
}

/* A text-only content: a string, or an array of {type: text, text} blocks (joined). */
static int text_of(json_t *content, const char *what, struct srv_buf *out, struct srv_api_error *e)
{
    if (json_is_string(content)) {
        srv_buf_put(out, json_string_value(content), json_string_length(content));
        return 0;
    }
    if (!json_is_array(content)) return srv_api_fail(e, 400, what, "%s must be a string or an array of blocks", what);
    size_t  i;
    json_t *b;
    json_array_foreach(content, i, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type || strcmp(type, "text") != 0 || !json_is_string(json_object_get(b, "text")))
            return srv_api_fail(e, 400, what, "%s[%zu] must be a text block {\"type\": \"text\", \"text\": ...}%s",
                                what, i, type && strcmp(type, "text") ? " (dsv4 takes text only)" : "");
        if (out->len) srv_buf_puts(out, "\n\n");
        json_t *t = json_object_get(b, "text");
        srv_buf_put(out, json_string_value(t), json_string_length(t));
    }
    return 0;
}

/* One user message: tool results first (as tool messages), then its text. */
static int user_message(json_t *content, size_t mi, json_t *list, struct srv_api_error *e)
{
    char what[64];
    snprintf(what, sizeof(what), "messages[%zu].content", mi);
    struct srv_buf text = { 0 };
    int            rc   = 0;
    if (json_is_string(content)) {
        rc = text_of(content, what, &text, e);
    } else if (!json_is_array(content)) {
        rc = srv_api_fail(e, 400, "messages", "%s must be a string or an array of content blocks", what);
    } else {
        size_t  i;
        json_t *b;
        json_array_foreach(content, i, b) {
            const char *type = json_string_value(json_object_get(b, "type"));
            if (type && !strcmp(type, "text") && json_is_string(json_object_get(b, "text"))) {
                json_t *t = json_object_get(b, "text");
                if (text.len) srv_buf_puts(&text, "\n\n");
                srv_buf_put(&text, json_string_value(t), json_string_length(t));
            } else if (type && !strcmp(type, "tool_result")) {
                const char *id = json_string_value(json_object_get(b, "tool_use_id"));
                if (!id) {
                    rc = srv_api_fail(e, 400, "messages", "%s[%zu].tool_use_id must be a string", what, i);
                    break;
                }
                struct srv_buf r = { 0 };
                json_t        *rcontent = json_object_get(b, "content");
                char           rwhat[96];
                snprintf(rwhat, sizeof(rwhat), "%s[%zu].content", what, i);
                if (rcontent && !json_is_null(rcontent)) rc = text_of(rcontent, rwhat, &r, e);
                if (!rc) {
                    json_t *m = json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id", id, "content", srv_json_buf(&r));
                    if (!m || json_array_append_new(list, m)) rc = srv_api_fail(e, 500, NULL, "out of memory");
                }
                srv_buf_free(&r);
                if (rc) break;
            } else {
                rc = srv_api_fail(e, 400, "messages", "%s[%zu] has type %s%s%s; dsv4 takes text and tool_result blocks "
                                  "in user turns", what, i, type ? "\"" : "", type ? type : "(none)", type ? "\"" : "");
                break;
            }
        }
    }
    if (!rc && (text.len || json_is_string(content))) {
        json_t *m = json_pack("{s:s, s:o}", "role", "user", "content", srv_json_buf(&text));
        if (!m || json_array_append_new(list, m)) rc = srv_api_fail(e, 500, NULL, "out of memory");
    }
    if (!rc && text.oom) rc = srv_api_fail(e, 500, NULL, "out of memory");
    srv_buf_free(&text);
    return rc;
}

/* One assistant message: thinking -> reasoning_content, text -> content, tool_use -> calls. */
static int assistant_message(json_t *content, size_t mi, json_t *list, struct srv_api_error *e)
{
    char what[64];
    snprintf(what, sizeof(what), "messages[%zu].content", mi);
    struct srv_buf text = { 0 }, reasoning = { 0 };
    json_t        *calls = json_array();
    int            rc    = calls ? 0 : srv_api_fail(e, 500, NULL, "out of memory");
    if (!rc && json_is_string(content)) {
        rc = text_of(content, what, &text, e);
    } else if (!rc && !json_is_array(content)) {
        rc = srv_api_fail(e, 400, "messages", "%s must be a string or an array of content blocks", what);
    } else if (!rc) {
        size_t  i;
        json_t *b;
        json_array_foreach(content, i, b) {
            const char *type = json_string_value(json_object_get(b, "type"));
            json_t     *t;
            if (type && !strcmp(type, "text") && json_is_string(t = json_object_get(b, "text"))) {
                srv_buf_put(&text, json_string_value(t), json_string_length(t));
            } else if (type && !strcmp(type, "thinking") && json_is_string(t = json_object_get(b, "thinking"))) {
                srv_buf_put(&reasoning, json_string_value(t), json_string_length(t));
            } else if (type && !strcmp(type, "redacted_thinking")) {
                continue; /* opaque to dsv4: nothing to render */
            } else if (type && !strcmp(type, "tool_use")) {
                const char *id = json_string_value(json_object_get(b, "id"));
                const char *nm = json_string_value(json_object_get(b, "name"));
                json_t     *in = json_object_get(b, "input");
                if (!id || !nm || !json_is_object(in)) {
                    rc = srv_api_fail(e, 400, "messages", "%s[%zu]: a tool_use block needs id, name and an input "
                                      "object", what, i);
                    break;
                }
                char   *args = json_dumps(in, JSON_COMPACT);
                json_t *call = args ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                                                "name", nm, "arguments", args)
                                    : NULL;
                free(args);
                if (!call || json_array_append_new(calls, call)) {
                    rc = srv_api_fail(e, 500, NULL, "out of memory");
                    break;
                }
            } else {
                rc = srv_api_fail(e, 400, "messages", "%s[%zu] has type %s%s%s; dsv4 takes text, thinking and tool_use "
                                  "blocks in assistant turns", what, i, type ? "\"" : "", type ? type : "(none)",
                                  type ? "\"" : "");
                break;
            }
        }
    }
    if (!rc) {
        json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", srv_json_buf(&text));
        if (m && reasoning.len) json_object_set_new(m, "reasoning_content", srv_json_buf(&reasoning));
        if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        if (!m || json_array_append_new(list, m) || text.oom || reasoning.oom)
            rc = srv_api_fail(e, 500, NULL, "out of memory");
    }
    json_decref(calls);
    srv_buf_free(&text);
    srv_buf_free(&reasoning);
    return rc;
}

/* Anthropic's tools {name, description, input_schema}, to the core's function tools. */
static const struct srv_tool_shape TOOLS = {
    .type = NULL, .schema = "input_schema", .schema_required = true,
    .only = "dsv4 runs client tools only (name, description, input_schema)",
    .needs = "a non-empty name, an input_schema object and a string description (if any)",
};

static int parse_sampling(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    static const struct srv_sampling_spec spec = { .temp_max = 1, .top_k_min = 0 };
    if (srv_req_sampling(c, o, &spec, g, e) || srv_json_bool(o, "stream", &g->stream, e) ||
        srv_req_stop(o, "stop_sequences", false, g, e))
        return -1;
    return srv_req_speculative(o, g, e); /* as on the OpenAI paths */
}

static int parse_thinking(json_t *o, struct dsv4_chat_params *cp, long long *budget, struct srv_api_error *e)
{
    json_t *th = srv_json_field(o, "thinking");
    if (!th) return 0;
    const char *type = json_string_value(json_object_get(th, "type"));
    if (!json_is_object(th) || !type)
        return srv_api_fail(e, 400, "thinking", "'thinking' must be an object with a \"type\"");
    if (!strcmp(type, "disabled")) return 0;
    if (strcmp(type, "enabled") && strcmp(type, "adaptive"))
        return srv_api_fail(e, 400, "thinking", "thinking.type is \"%s\"; use enabled, adaptive or disabled", type);
    *budget = -1;
    if (srv_json_int(th, "budget_tokens", 1, INT32_MAX, budget, e)) return -1;
    cp->mode = DSV4_CHAT_MODE_THINKING;
    return 0;
}

static int parse_tool_choice(json_t *o, struct srv_chat *ch, struct srv_api_error *e)
{
    json_t *tc = srv_json_field(o, "tool_choice");
    if (!tc) return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type)
        return srv_api_fail(e, 400, "tool_choice", "'tool_choice' must be an object with a \"type\"");
    if (!strcmp(type, "none")) {
        json_decref(ch->tools);
        ch->tools = NULL;
        return 0;
    }
    if (!strcmp(type, "auto")) return 0;
    if (!strcmp(type, "any") || !strcmp(type, "tool")) {
        const char *name = json_string_value(json_object_get(tc, "name"));
        if (!ch->tools) return srv_api_fail(e, 400, "tool_choice", "tool_choice \"%s\" needs tools", type);
        if (!strcmp(type, "tool") && (!name || !srv_req_has_tool(ch->tools, name)))
            return srv_api_fail(e, 400, "tool_choice", "tool_choice names %s%s%s, which is not in tools",
                                name ? "'" : "no tool", name ? name : "", name ? "'" : "");
        ch->force  = true;
        ch->forced = !strcmp(type, "tool") ? name : NULL;
        return 0;
    }
    return srv_api_fail(e, 400, "tool_choice", "tool_choice.type is \"%s\"; use auto, any, tool or none", type);
}

/* messages (and system) -> the chat document's message list. */
static int messages_of(json_t *o, json_t *list, struct srv_api_error *e)
{
    json_t *sys = srv_json_field(o, "system");
    if (sys) {
        struct srv_buf b = { 0 };
        int            rc = text_of(sys, "system", &b, e);
        json_t        *m  = rc ? NULL : json_pack("{s:s, s:o}", "role", "system", "content", srv_json_buf(&b));
        srv_buf_free(&b);
        if (rc) return -1;
        if (!m || json_array_append_new(list, m)) return srv_api_fail(e, 500, NULL, "out of memory");
    }
    json_t *msgs = srv_json_field(o, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return srv_api_fail(e, 400, "messages", "messages: must be a non-empty array of messages");
    size_t  i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t     *content = json_object_get(m, "content");
        if (!json_is_object(m) || !role || !content)
            return srv_api_fail(e, 400, "messages", "messages[%zu] must be an object with role and content", i);
        int rc;
        if (!strcmp(role, "user")) rc = user_message(content, i, list, e);
        else if (!strcmp(role, "assistant")) rc = assistant_message(content, i, list, e);
        else rc = srv_api_fail(e, 400, "messages", "messages[%zu].role is \"%s\"; use user or assistant", i, role);
        if (rc) return -1;
    }
    const char *last = json_string_value(json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "role"));
    if (!strcmp(last, "assistant"))
        return srv_api_fail(e, 400, "messages", "the last message is an assistant turn: prefilling the answer is not "
                            "supported by dsv4");
    return 0;
}

/* model and max_tokens, both required on /v1/messages (count_tokens needs neither). */
static int model_and_limit(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, long long *max_tokens,
                           struct srv_api_error *e)
{
    json_t *model = srv_json_field(o, "model");
    if (g->kind == SRV_API_MESSAGES && !model) return srv_api_fail(e, 400, "model", "model: Field required");
    if (model && !json_is_string(model)) return srv_api_fail(e, 400, "model", "model: must be a string");
    if (model && strcmp(json_string_value(model), c->model_name) != 0)
        return srv_api_fail(e, 404, "model", "model: %s (this server serves '%s')", json_string_value(model),
                            c->model_name);
    if (srv_json_int(o, "max_tokens", 1, INT32_MAX, max_tokens, e)) return -1;
    if (g->kind == SRV_API_MESSAGES && *max_tokens == 0)
        return srv_api_fail(e, 400, "max_tokens", "max_tokens: Field required");
    return 0;
}

static int parse(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    if (!c->tok)
        return srv_api_fail(e, 400, NULL, "this model has no tokenizer.json, so it cannot chat: use /v1/completions "
                            "with token ids");
    long long max_tokens = 0;
    if (refuse_unknown(o, e) || model_and_limit(c, o, g, &max_tokens, e) || parse_sampling(c, o, g, e)) return -1;
    struct srv_chat ch;
    srv_chat_init(&ch);
    ch.cp.mode = DSV4_CHAT_MODE_CHAT;
    int rc     = parse_thinking(o, &ch.cp, &ch.think_budget, e);
    if (!rc) rc = srv_req_tools(srv_json_field(o, "tools"), &TOOLS, &ch.tools, e);
    if (!rc) rc = parse_tool_choice(o, &ch, e);
    if (!rc && !(ch.messages = json_array())) rc = srv_api_fail(e, 500, NULL, "out of memory");
    if (!rc) rc = messages_of(o, ch.messages, e);
    if (!rc) rc = srv_req_chat(c, &ch, g->kind == SRV_API_COUNT, g, e);
    srv_chat_free(&ch);
    if (rc || g->kind == SRV_API_COUNT) return rc ? -1 : 0;
    rc = srv_req_limit(c, max_tokens, "max_tokens", 0, g, e);
    if (rc == SRV_REQ_NO_ROOM)
        return srv_api_fail(e, 400, "messages", "prompt is too long: %d tokens > %d maximum (the server's context "
                            "leaves no room for an answer)", g->n_prompt, c->ctx - 1);
    return rc;
}

/* ------------------------------------------------------------------ answers */

/* What one flush (streaming) or the whole answer holds, in the terms of this API. */
struct srv_anth_out {
    const char           *id, *model;
    const struct srv_buf *reasoning, *content;
    json_t               *calls;         /* OpenAI-shaped tool calls {id, function: {name, arguments}} */
    const char           *stop_reason;   /* end_turn, max_tokens, stop_sequence, tool_use */
    const char           *stop_sequence; /* the one that matched, or NULL */
    int                   n_prompt, n_cached, n_out;
};

static void sse_event(struct srv_buf *sse, const char *name, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return;
    srv_buf_printf(sse, "event: %s\ndata: %s\n\n", name, s);
    free(s);
}

static json_t *usage(int n_prompt, int n_cached, int n_out)
{
    /* input_tokens counts the prompt tokens computed; cache reads are reported apart */
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", n_prompt - n_cached, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", n_cached, "output_tokens", n_out);
}

/* A tool call as a tool_use block: the arguments the model wrote as the input object (a
 * call whose arguments are not a JSON object keeps them as {"arguments": "<text>"}). */
static json_t *tool_use_block(json_t *call)
{
    json_t     *fn   = json_object_get(call, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    json_t     *in   = args ? json_loads(args, JSON_DECODE_ANY, NULL) : NULL;
    if (!json_is_object(in)) {
        json_decref(in);
        in = json_pack("{s:s}", "arguments", args ? args : "");
    }
    return json_pack("{s:s, s:O, s:O, s:o}", "type", "tool_use", "id", json_object_get(call, "id"), "name",
                     json_object_get(fn, "name"), "input", in);
}

static json_t *message(const struct srv_anth_out *a)
{
    json_t *content = json_array();
    if (a->reasoning && a->reasoning->len)
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                                 srv_json_str(a->reasoning->p, a->reasoning->len), "signature", ""));
    bool calls = json_array_size(a->calls) > 0;
    if ((a->content && a->content->len) || (!calls && json_array_size(content) == 0))
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                                 srv_json_str(a->content && a->content->p ? a->content->p : "",
                                                              a->content ? a->content->len : 0)));
    size_t  i;
    json_t *c;
    json_array_foreach(a->calls, i, c) json_array_append_new(content, tool_use_block(c));
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", a->id, "type", "message", "role", "assistant",
                     "model", a->model, "content", content, "stop_reason", a->stop_reason, "stop_sequence",
                     a->stop_sequence ? json_string(a->stop_sequence) : json_null(), "usage",
                     usage(a->n_prompt, a->n_cached, a->n_out));
}

static void stream_begin(const struct srv_anth_out *a, struct srv_buf *sse)
{
    json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}", "id", a->id, "type", "message", "role",
                            "assistant", "model", a->model, "content", "stop_reason", "stop_sequence", "usage",
                            usage(a->n_prompt, 0, 0));
    sse_event(sse, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", msg));
    sse_event(sse, "ping", json_pack("{s:s}", "type", "ping"));
}

static void block_stop(struct srv_anth_stream *st, struct srv_buf *sse)
{
    if (st->open == SRV_ANTH_NONE) return;
    if (st->open == SRV_ANTH_THINKING)
        sse_event(sse, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta",
                                                        "index", st->index, "delta", "type", "signature_delta",
                                                        "signature", ""));
    sse_event(sse, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", st->index));
    st->open = SRV_ANTH_NONE;
}

static void block_start(struct srv_anth_stream *st, enum srv_anth_block kind, json_t *block, struct srv_buf *sse)
{
    block_stop(st, sse);
    st->index = st->next++;
    st->open  = kind;
    sse_event(sse, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                                                    st->index, "content_block", block));
}

static void text_delta(struct srv_anth_stream *st, enum srv_anth_block kind, const struct srv_buf *b,
                       struct srv_buf *sse)
{
    if (!b || b->len == 0) return;
    bool        th  = kind == SRV_ANTH_THINKING;
    const char *key = th ? "thinking" : "text";
    if (st->open != kind)
        block_start(st, kind, th ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")
                                 : json_pack("{s:s, s:s}", "type", "text", "text", ""), sse);
    sse_event(sse, "content_block_delta",
              json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", st->index, "delta", "type",
                        th ? "thinking_delta" : "text_delta", key, srv_json_str(b->p, b->len)));
}

static void stream_delta(struct srv_anth_stream *st, const struct srv_anth_out *a, struct srv_buf *sse)
{
    text_delta(st, SRV_ANTH_THINKING, a->reasoning, sse);
    text_delta(st, SRV_ANTH_TEXT, a->content, sse);
    size_t  i;
    json_t *c;
    json_array_foreach(a->calls, i, c) {
        json_t *b  = tool_use_block(c);
        json_t *in = json_incref(json_object_get(b, "input"));
        json_object_set_new(b, "input", json_object());
        block_start(st, SRV_ANTH_TOOL, b, sse);
        char *js = in ? json_dumps(in, JSON_COMPACT) : NULL;
        json_decref(in);
        sse_event(sse, "content_block_delta",
                  json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", st->index, "delta",
                            "type", "input_json_delta", "partial_json", js ? js : "{}"));
        free(js);
        block_stop(st, sse);
    }
}

static void stream_end(struct srv_anth_stream *st, const struct srv_anth_out *a, struct srv_buf *sse)
{
    block_stop(st, sse);
    sse_event(sse, "message_delta",
              json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason", a->stop_reason,
                        "stop_sequence", a->stop_sequence ? json_string(a->stop_sequence) : json_null(), "usage",
                        usage(a->n_prompt, a->n_cached, a->n_out)));
    sse_event(sse, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static struct srv_anth_out anth_out(const struct srv_out *o, const char *stop_reason, int n_cached)
{
    return (struct srv_anth_out){ .id = o->id, .model = o->model, .reasoning = &o->reasoning, .content = &o->content,
                                  .calls = o->calls, .stop_reason = stop_reason,
                                  .stop_sequence = o->stopped ? o->stop[o->stop_hit] : NULL, .n_prompt = o->n_prompt,
                                  .n_cached = n_cached, .n_out = o->n_tok };
}

/* Streaming: message_start and a ping. */
static void begin(struct srv_out *o, struct srv_buf *sse)
{
    struct srv_anth_out a = anth_out(o, NULL, 0);
    stream_begin(&a, sse);
}

/* Streaming: the content blocks of what the pipeline produced (the end comes from end). */
static void delta(struct srv_out *o, struct srv_buf *sse)
{
    struct srv_anth_out a = anth_out(o, NULL, 0);
    stream_delta(&o->anth, &a, sse);
    srv_out_clear_delta(o);
}

/* The end of an Anthropic answer: stop_reason from the OpenAI finish reason (and the stop
 * sequence that matched); an error is an "error" event mid-stream or an error body. */
static int end(struct srv_out *o, const struct srv_api_error *e, const char *finish, int n_cached,
               struct srv_buf *sse, struct srv_buf *body)
{
    const char *reason = o->stopped                    ? "stop_sequence"
                         : !strcmp(finish, "length")     ? "max_tokens"
                         : !strcmp(finish, "tool_calls") ? "tool_use"
                                                         : "end_turn";
    struct srv_anth_out a = anth_out(o, reason, n_cached);
    if (o->stream) {
        stream_delta(&o->anth, &a, sse);
        if (e) {
            block_stop(&o->anth, sse);
            sse_event(sse, "error", anth_error_obj(e));
        } else {
            stream_end(&o->anth, &a, sse);
        }
        return 200;
    }
    return srv_out_body(o, e ? NULL : message(&a), e, body);
}

const struct srv_dialect srv_dialect_anthropic = {
    .id_prefix = "msg_", .call_prefix = "toolu_", .parse = parse, .begin = begin, .delta = delta, .end = end,
    .error = srv_anth_error_json,
};
