/*
 * api_responses.c - the OpenAI Responses API: POST /v1/responses (whole and streamed), with
 * previous_response_id served from a bounded in-memory store of recent conversations.
 *
 * Requests are translated into the chat document every chat API renders (api_openai.c,
 * api_anthropic.c): `instructions` -> a leading system message; `input` as a string (one
 * user message) or items:
 *   message {role, content: string | input_text/output_text parts} -> that message
 *   reasoning {content: reasoning_text | summary: summary_text}     -> reasoning_content of
 *                                                                      the next assistant turn
 *   function_call {call_id, name, arguments}                        -> a tool call of the
 *                                                                      assistant turn (one
 *                                                                      turn for consecutive
 *                                                                      calls)
 *   function_call_output {call_id, output}                          -> a tool message
 * tools [{type: function, name, description, parameters}] -> function tools; tool_choice as
 * chat/completions (auto, none, required, {type: function, name}); reasoning.effort as
 * reasoning_effort.
 *
 * The answer's output items are built by one routine whether streamed or not (with no SSE
 * buffer it only builds them): a reasoning item (reasoning_text content), a message item
 * (output_text), then one function_call item per call. The conversation, with the answer as
 * an assistant turn, is then stored under the response id (unless store: false) so that a
 * request with previous_response_id continues it; instructions are not carried over, as
 * OpenAI specifies (the store is resp_store.c's).
 *
 * Sampling, tools, max_output_tokens and the rest of the chat go through the request core
 * (request.c, request_chat.c), as in every dialect.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/api.h"

/* ------------------------------------------------------------------ requests */

static const char *const FIELDS[] = {
    "model",       "input",  "instructions", "tools",       "tool_choice",          "max_output_tokens",
    "temperature", "top_p",  "stream",       "reasoning",   "previous_response_id", "store",
    "text",        "truncation", "speculative", NULL,
};
/* Sent by clients, without effect on the output here: accepted and ignored. */
static const char *const FIELDS_IGNORED[] = {
    "metadata", "parallel_tool_calls", "user", "service_tier", "prompt_cache_key", "safety_identifier", "include", NULL,
};

/* Text parts (input_text, output_text, text) or a string, joined. */
static int parts_text(json_t *content, const char *what, struct srv_buf *out, struct srv_api_error *e)
{
    if (json_is_string(content)) {
        srv_buf_put(out, json_string_value(content), json_string_length(content));
        return 0;
    }
    if (!json_is_array(content)) return srv_api_fail(e, 400, "input", "%s must be a string or an array of parts", what);
    size_t  i;
    json_t *p;
    json_array_foreach(content, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        json_t     *t    = json_object_get(p, "text");
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
                      strcmp(type, "reasoning_text") && strcmp(type, "summary_text")) || !json_is_string(t))
            return srv_api_fail(e, 400, "input", "%s[%zu] has type %s: dsv4 takes text parts only", what, i,
                                type ? type : "(none)");
        if (out->len) srv_buf_puts(out, "\n\n");
        srv_buf_put(out, json_string_value(t), json_string_length(t));
    }
    return 0;
}

/* The assistant turn at the end of list, opened when the last message is not one. */
static json_t *assistant_turn(json_t *list)
{
    json_t     *last = json_array_get(list, json_array_size(list) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (role && !strcmp(role, "assistant")) return last;
    json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
    if (m && json_array_append_new(list, m) == 0) return m;
    return NULL;
}

/* Input items -> chat messages appended to list. */
static int input_items(json_t *input, json_t *list, struct srv_api_error *e)
{
    if (json_is_string(input))
        return json_array_append_new(list, json_pack("{s:s, s:O}", "role", "user", "content", input))
                   ? srv_api_fail(e, 500, NULL, "out of memory")
                   : 0;
    if (!json_is_array(input)) return srv_api_fail(e, 400, "input", "'input' must be a string or an array of items");
    struct srv_buf reasoning = { 0 }; /* for the next assistant turn */
    size_t         i;
    json_t        *it;
    int            rc = 0;
    json_array_foreach(input, i, it) {
        char what[48];
        snprintf(what, sizeof(what), "input[%zu].content", i);
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!json_is_object(it)) {
            rc = srv_api_fail(e, 400, "input", "input[%zu] must be an object", i);
        } else if (role && (!type || !strcmp(type, "message"))) {
            if (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "assistant")) {
                rc = srv_api_fail(e, 400, "input", "input[%zu].role is \"%s\"; use user, system, developer or assistant",
                                  i, role);
                break;
            }
            struct srv_buf text = { 0 };
            if (!(rc = parts_text(json_object_get(it, "content"), what, &text, e))) {
                json_t *m = json_pack("{s:s, s:o}", "role", role, "content", srv_json_buf(&text));
                if (m && !strcmp(role, "assistant") && reasoning.len) {
                    json_object_set_new(m, "reasoning_content", srv_json_buf(&reasoning));
                    reasoning.len = 0;
                }
                if (!m || json_array_append_new(list, m)) rc = srv_api_fail(e, 500, NULL, "out of memory");
            }
            srv_buf_free(&text);
        } else if (type && !strcmp(type, "reasoning")) {
            /* the text is in content (reasoning_text) or summary (summary_text); an item with
             * neither adds none (and nothing is allocated for it: issue 35's leak) */
            json_t *c = json_object_get(it, "content"), *s = json_object_get(it, "summary");
            json_t *parts = json_is_array(c) && json_array_size(c) ? c : json_is_array(s) ? s : NULL;
            rc = parts ? parts_text(parts, what, &reasoning, e) : 0;
        } else if (type && !strcmp(type, "function_call")) {
            const char *id = json_string_value(json_object_get(it, "call_id"));
            const char *nm = json_string_value(json_object_get(it, "name"));
            const char *ar = json_string_value(json_object_get(it, "arguments"));
            if (!id || !nm || !ar) {
                rc = srv_api_fail(e, 400, "input", "input[%zu]: a function_call needs call_id, name and arguments "
                                  "(a string)", i);
                break;
            }
            json_t *turn = assistant_turn(list);
            json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", nm,
                                     "arguments", ar);
            json_t *calls = turn ? json_object_get(turn, "tool_calls") : NULL;
            if (turn && !calls) json_object_set_new(turn, "tool_calls", calls = json_array());
            if (turn && reasoning.len && !json_object_get(turn, "reasoning_content")) {
                json_object_set_new(turn, "reasoning_content", srv_json_buf(&reasoning));
                reasoning.len = 0;
            }
            if (!call || !calls || json_array_append_new(calls, call)) rc = srv_api_fail(e, 500, NULL, "out of memory");
        } else if (type && !strcmp(type, "function_call_output")) {
            const char *id = json_string_value(json_object_get(it, "call_id"));
            struct srv_buf out = { 0 };
            if (!id) rc = srv_api_fail(e, 400, "input", "input[%zu]: a function_call_output needs call_id", i);
            else rc = parts_text(json_object_get(it, "output"), what, &out, e);
            json_t *m = rc ? NULL : json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id", id, "content", srv_json_buf(&out));
            if (!rc && (!m || json_array_append_new(list, m))) rc = srv_api_fail(e, 500, NULL, "out of memory");
            srv_buf_free(&out);
        } else {
            rc = srv_api_fail(e, 400, "input", "input[%zu] has type %s; dsv4 takes message, reasoning, function_call "
                              "and function_call_output items", i, type ? type : "(none)");
        }
        if (rc) break;
    }
    srv_buf_free(&reasoning);
    return rc;
}

/* The Responses API's tools {type: function, name, description, parameters}, to the core's
 * function tools. */
static const struct srv_tool_shape TOOLS = {
    .type = "function", .schema = "parameters", .schema_required = false,
    .only = "dsv4 runs function tools only ({\"type\": \"function\", \"name\": ..., \"parameters\": {...}})",
    .needs = "a non-empty name, a string description (if any) and a parameters object (if any)",
};

static int parse_options(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct dsv4_chat_params *cp,
                         struct srv_api_error *e)
{
    static const struct srv_sampling_spec spec = { .temp_max = 2, .top_k_min = 0 };
    if (srv_req_sampling(c, o, &spec, g, e) || srv_json_bool(o, "stream", &g->stream, e) ||
        srv_req_speculative(o, g, e))
        return -1;
    g->store = true;
    if (srv_json_bool(o, "store", &g->store, e)) return -1;
    json_t *r = srv_json_field(o, "reasoning");
    if (r && !json_is_object(r)) return srv_api_fail(e, 400, "reasoning", "'reasoning' must be an object");
    json_t *effort = json_object_get(r, "effort");
    if (json_is_string(effort) && srv_req_effort(effort, "reasoning.effort", "reasoning", cp, e)) return -1;
    json_t *text = srv_json_field(o, "text");
    if (text && (!json_is_object(text) || (json_object_get(text, "format") &&
                                           !json_is_string(json_object_get(json_object_get(text, "format"), "type")))))
        return srv_api_fail(e, 400, "text", "'text' must be {\"format\": {\"type\": ...}}");
    json_t *tr = srv_json_field(o, "truncation");
    if (tr && (!json_is_string(tr) || strcmp(json_string_value(tr), "disabled")))
        return srv_api_fail(e, 400, "truncation", "'truncation' must be \"disabled\" (dsv4 never drops context)");
    return 0;
}

static int parse_tool_choice(json_t *o, struct srv_chat *ch, struct srv_api_error *e)
{
    json_t *tc = srv_json_field(o, "tool_choice");
    if (!tc) return 0;
    const char *s = json_string_value(tc);
    if (s && !strcmp(s, "auto")) return 0;
    if (s && !strcmp(s, "none")) {
        json_decref(ch->tools);
        ch->tools = NULL;
        return 0;
    }
    if (s && !strcmp(s, "required")) {
        ch->force = true;
    } else if (json_is_object(tc) && !strcmp(json_string_value(json_object_get(tc, "type")) ?: "", "function") &&
               json_is_string(json_object_get(tc, "name"))) {
        ch->force  = true;
        ch->forced = json_string_value(json_object_get(tc, "name"));
    } else {
        return srv_api_fail(e, 400, "tool_choice", "'tool_choice' must be auto, none, required or {\"type\": "
                            "\"function\", \"name\": ...}");
    }
    if (!ch->tools) return srv_api_fail(e, 400, "tool_choice", "'tool_choice' forces a call but no tools are given");
    if (ch->forced && !srv_req_has_tool(ch->tools, ch->forced))
        return srv_api_fail(e, 400, "tool_choice", "tool_choice names '%s', which is not in 'tools'", ch->forced);
    return 0;
}

static int refuse_unknown(const struct srv_api_ctx *c, json_t *o, struct srv_api_error *e)
{
    if (!c->tok)
        return srv_api_fail(e, 400, NULL, "this model has no tokenizer.json, so it cannot chat: use /v1/completions "
                            "with token ids");
    const char *const *lists[] = { FIELDS, FIELDS_IGNORED };
    const char        *unknown = srv_json_unknown_key(o, lists, 2);
    if (unknown) {
        srv_api_fail(e, 400, NULL, "Unknown parameter: '%s' (dsv4 does not implement it; docs/SERVER.md lists the "
                                   "fields it accepts)", unknown);
        srv_api_param(e, unknown);
        e->code = "unknown_parameter";
        return -1;
    }
    json_t *model = srv_json_field(o, "model");
    if (model && (!json_is_string(model) || strcmp(json_string_value(model), c->model_name))) {
        srv_api_fail(e, 400, "model", "The model '%s' does not exist; this server serves '%s'",
                     json_is_string(model) ? json_string_value(model) : "?", c->model_name);
        e->code = "model_not_found";
        return -1;
    }
    return 0;
}

/* The conversation: the stored one (previous_response_id), then this input; g keeps it for
 * the store. Then the chat document: instructions as a leading system message. */
static int conversation(const struct srv_api_ctx *c, json_t *o, struct srv_chat *ch, struct srv_gen *g,
                        struct srv_api_error *e)
{
    json_t *input = srv_json_field(o, "input");
    if (!input) return srv_api_fail(e, 400, "input", "'input' is required");
    json_t *instr = srv_json_field(o, "instructions");
    json_t *prev  = srv_json_field(o, "previous_response_id");
    if (instr && !json_is_string(instr)) return srv_api_fail(e, 400, "instructions", "'instructions' must be a string");
    if (prev && !json_is_string(prev))
        return srv_api_fail(e, 400, "previous_response_id", "'previous_response_id' must be a string");
    g->conv = prev ? (c->responses ? srv_resp_store_get(c->responses, json_string_value(prev)) : NULL) : json_array();
    if (!g->conv) {
        srv_api_fail(e, 400, "previous_response_id", "Previous response with id '%s' not found (dsv4 keeps the "
                     "most recent responses in memory, and none that asked for store: false)", json_string_value(prev));
        e->code = "previous_response_not_found";
        return -1;
    }
    if (input_items(input, g->conv, e) || srv_req_tools(srv_json_field(o, "tools"), &TOOLS, &ch->tools, e) ||
        parse_tool_choice(o, ch, e))
        return -1;
    if (json_array_size(g->conv) == 0) return srv_api_fail(e, 400, "input", "'input' holds no message");
    if (!(ch->messages = json_array())) return srv_api_fail(e, 500, NULL, "out of memory");
    if (instr || ch->tools)
        json_array_append_new(ch->messages, json_pack("{s:s, s:s}", "role", "system", "content",
                                                      instr ? json_string_value(instr) : ""));
    json_array_extend(ch->messages, g->conv);
    /* echoed in the response object */
    g->echo = json_pack("{s:O?, s:O?, s:b}", "instructions", instr, "previous_response_id", prev, "store", g->store);
    return 0;
}

static int parse(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    long long max_out = 0;
    if (refuse_unknown(c, o, e) || srv_json_int(o, "max_output_tokens", 1, INT32_MAX, &max_out, e)) return -1;
    struct srv_chat ch;
    srv_chat_init(&ch);
    ch.cp.mode      = DSV4_CHAT_MODE_CHAT;
    ch.param        = "input";
    ch.format       = json_object_get(srv_json_field(o, "text"), "format");
    ch.format_param = "text";
    ch.format_flat  = true;
    int rc          = parse_options(c, o, g, &ch.cp, e);
    if (!rc) rc = conversation(c, o, &ch, g, e);
    if (!rc) rc = srv_req_chat(c, &ch, false, g, e);
    srv_chat_free(&ch);
    if (rc) return -1;
    rc = srv_req_limit(c, max_out, "max_output_tokens", 0, g, e);
    if (rc == SRV_REQ_NO_ROOM) {
        srv_api_fail(e, 400, "input", "This model's maximum context length is %d tokens; the input has %d tokens, "
                     "which leaves no room for a response", c->ctx, g->n_prompt);
        e->code = "context_length_exceeded";
        return -1;
    }
    if (rc) return -1;
    if (g->echo && max_out > 0) json_object_set_new(g->echo, "max_output_tokens", json_integer(max_out));
    if (g->echo && srv_json_field(o, "text")) json_object_set(g->echo, "text", srv_json_field(o, "text"));
    return 0;
}

/* ------------------------------------------------------------------ answers */

/* What one flush or the whole answer holds, in the terms of this API. */
struct srv_resp_out {
    const char            *id, *model;
    long long              created;
    const struct srv_buf  *reasoning, *content;
    json_t                *calls;    /* OpenAI-shaped tool calls */
    json_t                *echo;     /* request fields for the response object */
    json_t                *conv;     /* the conversation, stored with the answer when store */
    bool                   store;
    struct srv_resp_store *responses;
    int                    n_prompt, n_cached, n_out, n_reason;
};

static void event(struct srv_resp_stream *st, struct srv_buf *sse, const char *type, json_t *o)
{
    if (!sse || !o) {
        json_decref(o);
        return;
    }
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "sequence_number", json_integer(st->seq++));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s) srv_buf_printf(sse, "event: %s\ndata: %s\n\n", type, s);
    free(s);
}

static json_t *usage(const struct srv_resp_out *a)
{
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", a->n_prompt, "input_tokens_details",
                     "cached_tokens", a->n_cached, "output_tokens", a->n_out, "output_tokens_details",
                     "reasoning_tokens", a->n_reason, "total_tokens", a->n_prompt + a->n_out);
}

static json_t *response_obj(const struct srv_resp_stream *st, const struct srv_resp_out *a, const char *status)
{
    json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:s, s:O, s:n, s:n, s:[], s:s, s:b, s:{s:{s:s}}, s:s, s:{}}", "id",
                          a->id, "object", "response", "created_at", (json_int_t)a->created, "status", status, "model",
                          a->model, "output", st->items, "error", "incomplete_details", "tools", "tool_choice", "auto",
                          "parallel_tool_calls", 1, "text", "format", "type", "text", "truncation", "disabled",
                          "metadata");
    if (!r) return NULL;
    json_object_update(r, a->echo);
    if (!json_object_get(r, "instructions")) json_object_set_new(r, "instructions", json_null());
    if (!json_object_get(r, "previous_response_id")) json_object_set_new(r, "previous_response_id", json_null());
    json_object_set_new(r, "usage", strcmp(status, "in_progress") ? usage(a) : json_null());
    if (!strcmp(status, "incomplete"))
        json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    return r;
}

/* Closes the open reasoning or message item: its done events, and it joins the items. */
static void item_close(struct srv_resp_stream *st, struct srv_buf *sse)
{
    if (st->open == SRV_RESP_NONE) return;
    bool        rs   = st->open == SRV_RESP_REASONING;
    json_t     *text = srv_json_str(st->text.p ? st->text.p : "", st->text.len);
    json_t     *part = rs ? json_pack("{s:s, s:O}", "type", "reasoning_text", "text", text)
                          : json_pack("{s:s, s:O, s:[]}", "type", "output_text", "text", text, "annotations");
    event(st, sse, rs ? "response.reasoning_text.done" : "response.output_text.done",
          json_pack("{s:s, s:i, s:i, s:O}", "item_id", st->item_id, "output_index", st->index, "content_index", 0,
                    "text", text));
    event(st, sse, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:O}", "item_id", st->item_id,
                                                           "output_index", st->index, "content_index", 0, "part", part));
    json_t *item = rs ? json_pack("{s:s, s:s, s:[], s:[O]}", "id", st->item_id, "type", "reasoning", "summary",
                                  "content", part)
                      : json_pack("{s:s, s:s, s:s, s:s, s:[O]}", "id", st->item_id, "type", "message", "status",
                                  "completed", "role", "assistant", "content", part);
    event(st, sse, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", st->index, "item", item));
    json_array_append_new(st->items, item);
    json_decref(part);
    json_decref(text);
    st->text.len = 0;
    st->open     = SRV_RESP_NONE;
}

static void item_text(struct srv_resp_stream *st, enum srv_resp_item kind, const struct srv_buf *b, struct srv_buf *sse)
{
    if (!b || b->len == 0) return;
    bool rs = kind == SRV_RESP_REASONING;
    if (st->open != kind) {
        item_close(st, sse);
        st->open  = kind;
        st->index = (int)json_array_size(st->items);
        srv_api_make_id(st->item_id, sizeof(st->item_id), rs ? "rs_" : "msg_");
        event(st, sse, "response.output_item.added",
              json_pack("{s:i, s:o}", "output_index", st->index, "item",
                        rs ? json_pack("{s:s, s:s, s:[], s:[]}", "id", st->item_id, "type", "reasoning", "summary",
                                       "content")
                           : json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", st->item_id, "type", "message", "status",
                                       "in_progress", "role", "assistant", "content")));
        event(st, sse, "response.content_part.added",
              json_pack("{s:s, s:i, s:i, s:o}", "item_id", st->item_id, "output_index", st->index, "content_index", 0,
                        "part", rs ? json_pack("{s:s, s:s}", "type", "reasoning_text", "text", "")
                                   : json_pack("{s:s, s:s, s:[]}", "type", "output_text", "text", "", "annotations")));
    }
    srv_buf_put(&st->text, b->p, b->len);
    json_t *d = json_pack("{s:s, s:i, s:i, s:o}", "item_id", st->item_id, "output_index", st->index, "content_index", 0,
                          "delta", srv_json_str(b->p, b->len));
    if (d && !rs) json_object_set_new(d, "logprobs", json_array());
    event(st, sse, rs ? "response.reasoning_text.delta" : "response.output_text.delta", d);
}

static void begin_items(struct srv_resp_stream *st, const struct srv_resp_out *a, struct srv_buf *sse)
{
    st->items = json_array();
    if (!sse) return;
    event(st, sse, "response.created", json_pack("{s:o}", "response", response_obj(st, a, "in_progress")));
    event(st, sse, "response.in_progress", json_pack("{s:o}", "response", response_obj(st, a, "in_progress")));
}

static void delta_items(struct srv_resp_stream *st, const struct srv_resp_out *a, struct srv_buf *sse)
{
    item_text(st, SRV_RESP_REASONING, a->reasoning, sse);
    item_text(st, SRV_RESP_MESSAGE, a->content, sse);
    size_t  i;
    json_t *c;
    json_array_foreach(a->calls, i, c) {
        item_close(st, sse);
        json_t     *fn   = json_object_get(c, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        char        fc[40];
        srv_api_make_id(fc, sizeof(fc), "fc_");
        int     index = (int)json_array_size(st->items);
        json_t *item  = json_pack("{s:s, s:s, s:s, s:O, s:O, s:s}", "id", fc, "type", "function_call", "status",
                                  "in_progress", "call_id", json_object_get(c, "id"), "name", json_object_get(fn, "name"),
                                  "arguments", "");
        event(st, sse, "response.output_item.added", json_pack("{s:i, s:O}", "output_index", index, "item", item));
        event(st, sse, "response.function_call_arguments.delta",
              json_pack("{s:s, s:i, s:s}", "item_id", fc, "output_index", index, "delta", args ? args : ""));
        event(st, sse, "response.function_call_arguments.done",
              json_pack("{s:s, s:i, s:s, s:O}", "item_id", fc, "output_index", index, "arguments", args ? args : "",
                        "name", json_object_get(fn, "name")));
        json_object_set_new(item, "arguments", json_string(args ? args : ""));
        json_object_set_new(item, "status", json_string("completed"));
        event(st, sse, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", index, "item", item));
        json_array_append_new(st->items, item);
    }
}

/* The answer's items as an assistant chat message (for the store). */
static json_t *items_message(json_t *items)
{
    json_t        *m = json_pack("{s:s}", "role", "assistant"), *calls = json_array();
    struct srv_buf text = { 0 }, rs = { 0 };
    size_t         i;
    json_t        *it;
    json_array_foreach(items, i, it) {
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *t    = json_string_value(json_object_get(json_array_get(json_object_get(it, "content"), 0), "text"));
        if (!strcmp(type, "reasoning") && t) srv_buf_puts(&rs, t);
        else if (!strcmp(type, "message") && t) srv_buf_puts(&text, t);
        else if (!strcmp(type, "function_call"))
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", json_object_get(it, "call_id"),
                                                   "type", "function", "function", "name", json_object_get(it, "name"),
                                                   "arguments", json_object_get(it, "arguments")));
    }
    json_object_set_new(m, "content", srv_json_buf(&text));
    if (rs.len) json_object_set_new(m, "reasoning_content", srv_json_buf(&rs));
    if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    json_decref(calls);
    srv_buf_free(&text);
    srv_buf_free(&rs);
    return m;
}

static json_t *end_items(struct srv_resp_stream *st, const struct srv_resp_out *a, bool incomplete, struct srv_buf *sse)
{
    item_close(st, sse);
    if (json_array_size(st->items) == 0) { /* an empty answer is still one (empty) message */
        st->open  = SRV_RESP_MESSAGE;
        st->index = 0;
        srv_api_make_id(st->item_id, sizeof(st->item_id), "msg_");
        item_close(st, NULL);
    }
    const char *status = incomplete ? "incomplete" : "completed";
    json_t     *r      = response_obj(st, a, status);
    if (a->store && a->conv && a->responses) {
        json_t *conv = json_deep_copy(a->conv);
        if (conv && json_array_append_new(conv, items_message(st->items)) == 0) srv_resp_store_put(a->responses, a->id, conv, r);
        else json_decref(conv);
    }
    if (sse) {
        event(st, sse, incomplete ? "response.incomplete" : "response.completed", json_pack("{s:O}", "response", r));
        json_decref(r);
        return NULL;
    }
    return r;
}

static void error_event(struct srv_resp_stream *st, const struct srv_api_error *e, struct srv_buf *sse)
{
    item_close(st, sse);
    event(st, sse, "error", json_pack("{s:s, s:s, s:n}", "code", e->status >= 500 ? "server_error" : "invalid_request",
                                      "message", e->msg, "param"));
}

static void stream_free(struct srv_resp_stream *st)
{
    json_decref(st->items);
    srv_buf_free(&st->text);
    memset(st, 0, sizeof(*st));
}

static struct srv_resp_out resp_out(const struct srv_out *o, int n_cached)
{
    return (struct srv_resp_out){ .id = o->id, .model = o->model, .created = o->created, .reasoning = &o->reasoning,
                                  .content = &o->content, .calls = o->calls, .echo = o->echo, .conv = o->conv,
                                  .store = o->store, .responses = o->responses, .n_prompt = o->n_prompt,
                                  .n_cached = n_cached, .n_out = o->n_tok, .n_reason = o->n_reason };
}

static int open_out(struct srv_out *o, const struct srv_gen *g, const struct srv_api_ctx *c)
{
    o->echo      = json_incref(g->echo);
    o->conv      = json_incref(g->conv);
    o->store     = g->store;
    o->responses = c->responses;
    struct srv_resp_out a = resp_out(o, 0);
    begin_items(&o->resp, &a, NULL); /* the stream's events are sent by begin */
    return o->resp.items ? 0 : -1;
}

static void close_out(struct srv_out *o)
{
    stream_free(&o->resp);
    json_decref(o->echo);
    json_decref(o->conv);
}

/* Streaming: response.created and response.in_progress, on a fresh item list. */
static void begin(struct srv_out *o, struct srv_buf *sse)
{
    struct srv_resp_out a     = resp_out(o, 0);
    json_t             *items = o->resp.items;
    begin_items(&o->resp, &a, sse);
    json_decref(items);
}

/* The output items, streamed or only built (this dialect's delta runs on every token). */
static void delta(struct srv_out *o, struct srv_buf *sse)
{
    struct srv_resp_out a = resp_out(o, 0);
    delta_items(&o->resp, &a, o->stream ? sse : NULL);
    srv_out_clear_delta(o);
}

/* The end of a Responses answer: the last items, the response object (the body, or the
 * response.completed / response.incomplete event); an error is an error event or body. */
static int end(struct srv_out *o, const struct srv_api_error *e, const char *finish, int n_cached,
               struct srv_buf *sse, struct srv_buf *body)
{
    struct srv_resp_out a = resp_out(o, n_cached);
    delta_items(&o->resp, &a, o->stream ? sse : NULL);
    srv_out_clear_delta(o);
    if (o->stream) {
        if (e) error_event(&o->resp, e, sse);
        else end_items(&o->resp, &a, !strcmp(finish, "length"), sse);
        return 200;
    }
    return srv_out_body(o, e ? NULL : end_items(&o->resp, &a, !strcmp(finish, "length"), NULL), e, body);
}

const struct srv_dialect srv_dialect_responses = {
    .id_prefix = "resp_", .call_prefix = "call_", .parse = parse, .open = open_out, .close = close_out,
    .begin = begin, .delta = delta, .every_token = true, .end = end, .error = srv_api_error_json,
};
