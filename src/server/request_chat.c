/*
 * request_chat.c - the core of every chat request (chat/completions, messages, responses):
 * a dialect translates its body into struct srv_chat (the V4 chat messages, function tools,
 * the tool choice, the output format, the thinking mode), and this file does the rest once:
 * tools converted to function tools, the document rendered (dsv4_chat_render_json, the
 * DeepSeek-V4 encoding) and tokenized, a forced call's opening appended, the output
 * constrained (a JSON format, strict tools, a thinking budget). The dialect then applies the
 * limit (request.c's rule) to the prompt this leaves.
 *
 * The encoding renders tools and format hints on a leading system message only, so one is
 * put first when the conversation has none (srv_req_lead_system).
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/api.h"

/* ------------------------------------------------------------------ the document */

void srv_chat_init(struct srv_chat *ch)
{
    memset(ch, 0, sizeof(*ch));
    dsv4_chat_params_default(&ch->cp);
    ch->think_budget = -1;
    ch->param        = "messages";
}

void srv_chat_free(struct srv_chat *ch)
{
    json_decref(ch->messages);
    json_decref(ch->tools);
    ch->messages = ch->tools = NULL;
}

json_t *srv_req_lead_system(json_t *messages)
{
    json_t     *first = json_array_get(messages, 0);
    const char *role0 = json_string_value(json_object_get(first, "role"));
    if (!role0 || (strcmp(role0, "system") && strcmp(role0, "developer"))) {
        first = json_pack("{s:s, s:s}", "role", "system", "content", "");
        return first && json_array_insert_new(messages, 0, first) == 0 ? first : NULL;
    }
    first = json_copy(first); /* shallow: do not change the request's own message */
    return first && json_array_set_new(messages, 0, first) == 0 ? first : NULL;
}

int srv_req_effort(json_t *v, const char *name, const char *param, struct dsv4_chat_params *cp, struct srv_api_error *e)
{
    if (!v) return 0;
    const char *s = json_string_value(v);
    if (!s) return srv_api_fail(e, 400, param, "'%s' must be a string", name);
    if (!strcmp(s, "none") || !strcmp(s, "minimal")) {
        cp->mode = DSV4_CHAT_MODE_CHAT;
    } else if (!strcmp(s, "low") || !strcmp(s, "medium")) {
        cp->mode   = DSV4_CHAT_MODE_THINKING;
        cp->effort = DSV4_CHAT_EFFORT_DEFAULT;
    } else if (!strcmp(s, "high")) {
        cp->mode   = DSV4_CHAT_MODE_THINKING;
        cp->effort = DSV4_CHAT_EFFORT_HIGH;
    } else if (!strcmp(s, "max") || !strcmp(s, "xhigh")) {
        cp->mode   = DSV4_CHAT_MODE_THINKING;
        cp->effort = DSV4_CHAT_EFFORT_MAX;
    } else {
        return srv_api_fail(e, 400, param, "'%s' is \"%s\"; use none, low, medium, high or max", name, s);
    }
    return 0;
}

/* The chat document {messages, tools} -> the V4 prompt -> token ids in g (doc is consumed).
 * Message text is tokenized as text (no control token can be typed in) unless the server
 * trusts its callers (--special-tokens-in-messages). */
static int render(const struct srv_api_ctx *c, json_t *doc, const struct dsv4_chat_params *cp, const char *param,
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
static int force_tool(const struct srv_api_ctx *c, struct srv_gen *g, const char *name, const char *param,
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

static int constrain(const struct srv_api_ctx *c, json_t *fmt, bool responses, const char *param, struct srv_gen *g,
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

static int strict_call(const struct srv_api_ctx *c, json_t *tools, bool forced, const char *name, struct srv_gen *g,
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
bool srv_req_has_tool(json_t *tools, const char *name)
{
    size_t  i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && !strcmp(n, name)) return true;
    }
    return false;
}

/* ------------------------------------------------------------------ tools */

int srv_req_tools(json_t *tools, const struct srv_tool_shape *shape, json_t **out, struct srv_api_error *e)
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
        json_t     *sch  = json_object_get(t, shape->schema), *desc = json_object_get(t, "description");
        bool        typed = shape->type ? type && !strcmp(type, shape->type) : !type || !strcmp(type, "custom");
        int         rc    = 0;
        if (!json_is_object(t) || !typed)
            rc = srv_api_fail(e, 400, "tools", "tools[%zu] has type \"%s\": %s", i, type ? type : "?", shape->only);
        else if (!name || !name[0] || (desc && !json_is_null(desc) && !json_is_string(desc)) ||
                 (shape->schema_required ? !json_is_object(sch) : sch && !json_is_null(sch) && !json_is_object(sch)))
            rc = srv_api_fail(e, 400, "tools", "tools[%zu] needs %s", i, shape->needs);
        json_t *fn = rc ? NULL : json_pack("{s:s}", "name", name);
        if (fn && json_is_string(desc)) json_object_set(fn, "description", desc);
        if (fn && json_is_object(sch)) json_object_set(fn, "parameters", sch);
        if (fn && json_is_true(json_object_get(t, "strict"))) json_object_set_new(fn, "strict", json_true());
        json_t *tool = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
        if (!rc && (!tool || json_array_append_new(fn_tools, tool))) rc = srv_api_fail(e, 500, NULL, "out of memory");
        if (rc) {
            json_decref(fn_tools);
            return -1;
        }
    }
    if (json_array_size(fn_tools) == 0) json_decref(fn_tools), fn_tools = NULL;
    *out = fn_tools;
    return 0;
}

/* ------------------------------------------------------------------ the request */

/* thinking budget: past it only </think> may come (the constraint machinery, alone or on
 * the strict tools' one) */
static int think_budget(const struct srv_api_ctx *c, long long budget, struct srv_gen *g, struct srv_api_error *e)
{
    int32_t think_end;
    if (budget <= 0 || dsv4_tokenizer_token_id(c->tok, "</think>", &think_end, NULL) != DSV4_OK) return 0;
    struct dsv4_err err;
    if (g->constraint) dsv4_constraint_set_think_budget(g->constraint, (int)budget);
    else if (dsv4_constraint_new_think(&g->constraint, c->tok, think_end, (int)budget, &err))
        return srv_api_fail(e, 500, NULL, "%s", err.msg);
    return 0;
}

int srv_req_chat(const struct srv_api_ctx *c, struct srv_chat *ch, bool count_only, struct srv_gen *g,
                 struct srv_api_error *e)
{
    if (ch->tools && !srv_req_lead_system(ch->messages)) return srv_api_fail(e, 500, NULL, "out of memory");
    json_t *doc = json_pack("{s:O}", "messages", ch->messages);
    if (doc && ch->tools) json_object_set(doc, "tools", ch->tools);
    g->tools = ch->tools != NULL;
    if (render(c, doc, &ch->cp, ch->param, g, e)) return -1;
    if (ch->force && force_tool(c, g, ch->forced, "tool_choice", e)) return -1;
    if (count_only) return 0;
    if (ch->format && ch->force)
        return srv_api_fail(e, 400, ch->format_param, "%s and a forced tool call cannot be combined",
                            ch->format_flat ? "text.format" : "'response_format'");
    if (ch->format && constrain(c, ch->format, ch->format_flat, ch->format_param, g, e)) return -1;
    if (ch->tools && c->json_vocab && strict_call(c, ch->tools, ch->force, ch->forced, g, e)) return -1;
    return think_budget(c, ch->think_budget, g, e);
}
