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
 *   tool_choice any / tool              -> a forced call (srv_api_force_tool; not with thinking)
 * Not supported, refused with a 400 that says so: images and documents, server tools, a
 * trailing assistant message (prefill).
 * max_tokens is required (as the API requires it) and clipped to the context left.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/server.h"

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
    snprintf(e->param_buf, sizeof(e->param_buf), "%s", key);
    e->param = e->param_buf;
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

static json_t *jbuf(const struct srv_buf *b)
{
    return json_stringn(b->p ? b->p : "", b->len);
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
                    json_t *m = json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id", id, "content", jbuf(&r));
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
        json_t *m = json_pack("{s:s, s:o}", "role", "user", "content", jbuf(&text));
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
        json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", jbuf(&text));
        if (m && reasoning.len) json_object_set_new(m, "reasoning_content", jbuf(&reasoning));
        if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        if (!m || json_array_append_new(list, m) || text.oom || reasoning.oom)
            rc = srv_api_fail(e, 500, NULL, "out of memory");
    }
    json_decref(calls);
    srv_buf_free(&text);
    srv_buf_free(&reasoning);
    return rc;
}

/* tools -> OpenAI-style function tools (NULL when there are none to offer). */
static int tools_of(json_t *tools, json_t **out, struct srv_api_error *e)
{
    *out = NULL;
    if (!tools) return 0;
    if (!json_is_array(tools)) return srv_api_fail(e, 400, "tools", "'tools' must be an array");
    json_t *fn_tools = json_array();
    if (!fn_tools) return srv_api_fail(e, 500, NULL, "out of memory");
    size_t  i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t     *sch  = json_object_get(t, "input_schema");
        json_t     *desc = json_object_get(t, "description");
        if (!json_is_object(t) || (type && strcmp(type, "custom") != 0)) {
            json_decref(fn_tools);
            return srv_api_fail(e, 400, "tools", "tools[%zu] has type \"%s\": dsv4 runs client tools only (name, "
                                "description, input_schema)", i, type ? type : "?");
        }
        if (!name || !name[0] || !json_is_object(sch) || (desc && !json_is_null(desc) && !json_is_string(desc))) {
            json_decref(fn_tools);
            return srv_api_fail(e, 400, "tools", "tools[%zu] needs a non-empty name, an input_schema object and a "
                                "string description (if any)", i);
        }
        json_t *fn = json_pack("{s:s}", "name", name);
        if (fn && json_is_string(desc)) json_object_set(fn, "description", desc);
        if (fn) json_object_set(fn, "parameters", sch);
        if (fn && json_is_true(json_object_get(t, "strict"))) json_object_set_new(fn, "strict", json_true());
        json_t *tool = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
        if (!tool || json_array_append_new(fn_tools, tool)) {
            json_decref(fn_tools);
            return srv_api_fail(e, 500, NULL, "out of memory");
        }
    }
    if (json_array_size(fn_tools) == 0) json_decref(fn_tools), fn_tools = NULL;
    *out = fn_tools;
    return 0;
}

static int parse_sampling(json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    double    temp = 1.0, top_p = 1.0;
    long long top_k = 0;
    if (srv_json_num(o, "temperature", 0, 1, false, &temp, e) || srv_json_num(o, "top_p", 0, 1, true, &top_p, e) ||
        srv_json_int(o, "top_k", 0, 1 << 30, &top_k, e) || srv_json_bool(o, "stream", &g->stream, e))
        return -1;
    g->sp.temperature = (float)temp;
    g->sp.top_p       = (float)top_p;
    g->sp.top_k       = (int)top_k;
    g->sp.seed        = srv_random_u64();
    json_t *stop = srv_json_field(o, "stop_sequences");
    if (stop) {
        if (!json_is_array(stop) || json_array_size(stop) > SRV_MAX_STOP)
            return srv_api_fail(e, 400, "stop_sequences", "'stop_sequences' must be an array of at most %d strings",
                                SRV_MAX_STOP);
        size_t  i;
        json_t *s;
        json_array_foreach(stop, i, s) {
            size_t len = json_string_length(s);
            if (!json_is_string(s) || len == 0 || len > SRV_MAX_STOP_LEN || strlen(json_string_value(s)) != len)
                return srv_api_fail(e, 400, "stop_sequences", "each stop sequence must be a string of 1 to %d bytes "
                                    "without NUL", SRV_MAX_STOP_LEN);
            memcpy(g->stop[g->n_stop++], json_string_value(s), len + 1);
        }
    }
    return srv_api_speculative(o, g, e); /* as on the OpenAI paths */
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

static int parse_tool_choice(json_t *o, json_t **tools, bool *force, const char **forced, struct srv_api_error *e)
{
    json_t *tc = srv_json_field(o, "tool_choice");
    if (!tc) return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type)
        return srv_api_fail(e, 400, "tool_choice", "'tool_choice' must be an object with a \"type\"");
    if (!strcmp(type, "none")) {
        json_decref(*tools);
        *tools = NULL;
        return 0;
    }
    if (!strcmp(type, "auto")) return 0;
    if (!strcmp(type, "any") || !strcmp(type, "tool")) {
        const char *name = json_string_value(json_object_get(tc, "name"));
        if (!*tools) return srv_api_fail(e, 400, "tool_choice", "tool_choice \"%s\" needs tools", type);
        if (!strcmp(type, "tool") && (!name || !srv_api_has_tool(*tools, name)))
            return srv_api_fail(e, 400, "tool_choice", "tool_choice names %s%s%s, which is not in tools",
                                name ? "'" : "no tool", name ? name : "", name ? "'" : "");
        *force = true;
        *forced = !strcmp(type, "tool") ? name : NULL;
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
        json_t        *m  = rc ? NULL : json_pack("{s:s, s:o}", "role", "system", "content", jbuf(&b));
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

int srv_anth_parse(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    if (!c->tok)
        return srv_api_fail(e, 400, NULL, "this model has no tokenizer.json, so it cannot chat: use /v1/completions "
                            "with token ids");
    if (refuse_unknown(o, e)) return -1;
    json_t *model = srv_json_field(o, "model");
    if (g->kind == SRV_API_MESSAGES && !model) return srv_api_fail(e, 400, "model", "model: Field required");
    if (model && !json_is_string(model)) return srv_api_fail(e, 400, "model", "model: must be a string");
    if (model && strcmp(json_string_value(model), c->model_name) != 0)
        return srv_api_fail(e, 404, "model", "model: %s (this server serves '%s')", json_string_value(model),
                            c->model_name);
    long long max_tokens = 0;
    if (srv_json_int(o, "max_tokens", 1, INT32_MAX, &max_tokens, e)) return -1;
    if (g->kind == SRV_API_MESSAGES && max_tokens == 0)
        return srv_api_fail(e, 400, "max_tokens", "max_tokens: Field required");
    if (parse_sampling(o, g, e)) return -1;
    struct dsv4_chat_params cp;
    dsv4_chat_params_default(&cp);
    cp.mode          = DSV4_CHAT_MODE_CHAT;
    long long budget = -1; /* thinking.budget_tokens: reasoning tokens at most */
    if (parse_thinking(o, &cp, &budget, e)) return -1;

    json_t     *tools  = NULL;
    bool        force  = false;
    const char *forced = NULL; /* points into the request: used before o is freed */
    if (tools_of(srv_json_field(o, "tools"), &tools, e) || parse_tool_choice(o, &tools, &force, &forced, e)) {
        json_decref(tools);
        return -1;
    }
    json_t *list = json_array();
    int     rc   = list ? messages_of(o, list, e) : srv_api_fail(e, 500, NULL, "out of memory");
    if (!rc && tools) { /* the encoding renders tools on a leading system message only */
        const char *role0 = json_string_value(json_object_get(json_array_get(list, 0), "role"));
        if (!role0 || strcmp(role0, "system") != 0)
            json_array_insert_new(list, 0, json_pack("{s:s, s:s}", "role", "system", "content", ""));
    }
    json_t *doc = rc ? NULL : json_pack("{s:O}", "messages", list);
    json_decref(list);
    if (doc && tools) json_object_set(doc, "tools", tools);
    g->tools = tools != NULL;
    json_decref(tools);
    if (rc) return -1;
    if (srv_api_render(c, doc, &cp, "messages", g, e)) return -1;
    if (force && srv_api_force_tool(c, g, forced, "tool_choice", e)) return -1;
    if (g->kind == SRV_API_COUNT) return 0;
    if (c->json_vocab && g->tools) { /* strict tools: the arguments of the calls are constrained */
        json_t              *fn_tools = NULL;
        struct srv_api_error ignored; /* the tools were checked above */
        tools_of(srv_json_field(o, "tools"), &fn_tools, &ignored);
        int rc2 = fn_tools ? srv_api_strict_call(c, fn_tools, force, forced, g, e) : 0;
        json_decref(fn_tools);
        if (rc2) return -1;
    }
    int32_t think_end;
    if (budget > 0 && dsv4_tokenizer_token_id(c->tok, "</think>", &think_end, NULL) == DSV4_OK) {
        /* past the budget only </think> may come (the constraint machinery, alone or on the
         * strict tools' one) */
        struct dsv4_err err;
        if (g->constraint) dsv4_constraint_set_think_budget(g->constraint, (int)budget);
        else if (dsv4_constraint_new_think(&g->constraint, c->tok, think_end, (int)budget, &err))
            return srv_api_fail(e, 500, NULL, "%s", err.msg);
    }
    if (g->n_prompt >= c->ctx)
        return srv_api_fail(e, 400, "messages", "prompt is too long: %d tokens > %d maximum (the server's context "
                            "leaves no room for an answer)", g->n_prompt, c->ctx - 1);
    g->max_tokens = max_tokens < c->ctx - g->n_prompt ? (int)max_tokens : c->ctx - g->n_prompt;
    return 0;
}

/* ------------------------------------------------------------------ responses */

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

json_t *srv_anth_message(const struct srv_anth_out *a)
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

void srv_anth_stream_begin(const struct srv_anth_out *a, struct srv_buf *sse)
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

void srv_anth_stream_delta(struct srv_anth_stream *st, const struct srv_anth_out *a, struct srv_buf *sse)
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

void srv_anth_stream_end(struct srv_anth_stream *st, const struct srv_anth_out *a, struct srv_buf *sse)
{
    block_stop(st, sse);
    sse_event(sse, "message_delta",
              json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason", a->stop_reason,
                        "stop_sequence", a->stop_sequence ? json_string(a->stop_sequence) : json_null(), "usage",
                        usage(a->n_prompt, a->n_cached, a->n_out)));
    sse_event(sse, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

void srv_anth_stream_error(struct srv_anth_stream *st, const struct srv_api_error *e, struct srv_buf *sse)
{
    block_stop(st, sse);
    sse_event(sse, "error", anth_error_obj(e));
}
