/*
 * chat.c - messages -> the DeepSeek-V4 prompt string, as the official
 * encoding/encoding_dsv4.py of the V4 release renders it (encode_messages without a
 * context prefix). The rules, in the order the official encoder applies them:
 *
 *   1. Tool results are not a role of their own: each "tool" message becomes a
 *      <tool_result> block of a user turn (joined to the user turn before it when there is
 *      one), and consecutive user messages are joined into one turn ("\n\n" between blocks)
 *      unless the first carries a task.
 *   2. Several tool results in one turn are put in the order of the calls of the last
 *      assistant turn that made calls (by tool_call_id; unknown ids sort first, stably).
 *   3. BOS, then, in thinking mode, the "max" reasoning-effort prefix.
 *   4. Unless asked to keep them, reasoning and developer turns before the last user turn
 *      are dropped in thinking mode, except when any message defines tools (then every
 *      turn keeps its reasoning).
 *   5. Each message renders by role; system text is raw (no role token); the turn after a
 *      user/developer message opens with <｜Assistant｜> and <think> or </think>.
 *
 * JSON put into the prompt (tool schemas, non-string arguments, response formats) is
 * written by pyjson.c, byte for byte as Python's json.dumps. All allocations of one render
 * live in one arena and are released together.
 *
 * Every byte that comes from the messages rather than from the template (text, reasoning,
 * tool names, arguments and schemas) is recorded as a literal range; the _marked renderer
 * returns them as a byte mask so that dsv4_tokenizer_encode_marked matches no control token
 * inside them: a user who types "<｜Assistant｜>" gets those characters, not a forged turn.
 */
#include <stdlib.h>
#include <string.h>

#include "tok/tok.h"

#define BOS_TEXT       "<｜begin▁of▁sentence｜>"
#define EOS_TEXT       "<｜end▁of▁sentence｜>"
#define USER_TEXT      "<｜User｜>"
#define ASSISTANT_TEXT "<｜Assistant｜>"
#define REMINDER_TEXT  "<｜latest_reminder｜>"
#define THINK_START    "<think>"
#define THINK_END      "</think>"
#define DSML           "｜DSML｜"

static const char *const TASK_TEXT[] = {
    NULL, "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>",
};
static const char *const TASK_NAME[] = { NULL, "action", "query", "authority", "domain", "title", "read_url" };

static const char EFFORT_MAX_TEXT[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

static const char TOOLS_HEAD[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<" DSML "tool_calls>\" block like the following:\n\n"
    "<" DSML "tool_calls>\n"
    "<" DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML "parameter>\n"
    "...\n"
    "</" DSML "invoke>\n"
    "<" DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSML "invoke>\n"
    "</" DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " THINK_START "), you MUST output your complete reasoning inside "
    THINK_START "..." THINK_END " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " THINK_END " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";

static const char TOOLS_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

static const char RESPONSE_FORMAT_HEAD[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/* ------------------------------------------------------------------ internal messages */

struct ccall {
    const char *id;   /* "" when none */
    const char *name;
    json_t     *args; /* the parsed arguments object, or NULL when they are not JSON */
    const char *raw;  /* the arguments text */
};

enum block_type { BLOCK_TEXT, BLOCK_TOOL_RESULT };

struct cblock {
    enum block_type type;
    const char     *text;        /* text, or the tool result's content */
    const char     *tool_use_id; /* "" when none */
};

struct cmsg {
    enum dsv4_chat_role role;
    const char         *content;
    const char         *reasoning;
    struct ccall       *calls;
    size_t              n_calls;
    const char         *tool_call_id;
    json_t             *tools;           /* array or NULL */
    json_t             *response_format; /* any JSON or NULL */
    enum dsv4_chat_task task;
    bool                no_eos;
    struct cblock      *blocks; /* user turns after merging */
    size_t              n_blocks, cap_blocks;
};

struct render {
    struct dsv4_arena arena;
    json_t          **owned; /* JSON values to release at the end */
    size_t            n_owned, cap_owned;
    size_t           *lit;   /* [2 * n_lit]: [begin, end) byte ranges of request text in the output */
    size_t            n_lit, cap_lit;
    bool              lit_oom;
    struct dsv4_err  *err;
};

/* Marks out[begin, end) as request text (see the file header). */
static void mark_literal(struct render *r, size_t begin, size_t end)
{
    if (begin >= end) return;
    if (r->n_lit && r->lit[2 * r->n_lit - 1] == begin) { /* adjacent: extend */
        r->lit[2 * r->n_lit - 1] = end;
        return;
    }
    if (r->n_lit == r->cap_lit) {
        size_t  cap = r->cap_lit ? 2 * r->cap_lit : 32;
        size_t *l   = realloc(r->lit, 2 * cap * sizeof(*l));
        if (!l) {
            r->lit_oom = true;
            return;
        }
        r->lit     = l;
        r->cap_lit = cap;
    }
    r->lit[2 * r->n_lit]     = begin;
    r->lit[2 * r->n_lit + 1] = end;
    r->n_lit++;
}

/* Appends request text (not template text) to the prompt. */
static void put_lit(struct render *r, struct tok_buf *b, const char *s, size_t n)
{
    size_t at = b->len;
    tok_buf_put(b, s, n);
    mark_literal(r, at, b->len);
}

static void puts_lit(struct render *r, struct tok_buf *b, const char *s)
{
    put_lit(r, b, s, strlen(s));
}

/* Request JSON (tool schemas, arguments, response formats) as Python's json.dumps writes it. */
static int dump_lit(struct render *r, struct tok_buf *b, const json_t *v)
{
    size_t at = b->len;
    int    rc = tok_pyjson_dump(b, v, r->err);
    mark_literal(r, at, b->len);
    return rc;
}

static void *ralloc(struct render *r, size_t n)
{
    void *p = dsv4_arena_alloc(&r->arena, n ? n : 1, 16);
    if (p) memset(p, 0, n);
    return p;
}

static int own(struct render *r, json_t *v)
{
    if (r->n_owned == r->cap_owned) {
        size_t   cap = r->cap_owned ? 2 * r->cap_owned : 16;
        json_t **o   = realloc(r->owned, cap * sizeof(*o));
        if (!o) {
            json_decref(v);
            return dsv4_err_set(r->err, DSV4_ENOMEM, "out of memory rendering the chat");
        }
        r->owned     = o;
        r->cap_owned = cap;
    }
    r->owned[r->n_owned++] = v;
    return DSV4_OK;
}

/* Python truthiness of a JSON value: null, false, 0, "", [] and {} are false. */
static bool json_truthy(const json_t *v)
{
    if (!v) return false;
    switch (json_typeof(v)) {
    case JSON_NULL:
    case JSON_FALSE: return false;
    case JSON_TRUE: return true;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0.0;
    case JSON_STRING: return json_string_length(v) != 0;
    case JSON_ARRAY: return json_array_size(v) != 0;
    case JSON_OBJECT: return json_object_size(v) != 0;
    }
    return false;
}

static int add_block(struct render *r, struct cmsg *m, enum block_type type, const char *text, const char *id)
{
    if (m->n_blocks == m->cap_blocks) {
        size_t         cap = m->cap_blocks ? 2 * m->cap_blocks : 4;
        struct cblock *b   = ralloc(r, cap * sizeof(*b));
        if (!b) return dsv4_err_set(r->err, DSV4_ENOMEM, "out of memory rendering the chat");
        if (m->n_blocks) memcpy(b, m->blocks, m->n_blocks * sizeof(*b));
        m->blocks     = b;
        m->cap_blocks = cap;
    }
    m->blocks[m->n_blocks++] = (struct cblock){ type, text ? text : "", id ? id : "" };
    return DSV4_OK;
}

/* Rule 1: tool messages join user turns, consecutive user messages join each other. */
static int merge_tool_messages(struct render *r, const struct cmsg *in, size_t n, struct cmsg *out, size_t *n_out)
{
    size_t k = 0;
    int    rc;
    for (size_t i = 0; i < n; i++) {
        const struct cmsg *m    = &in[i];
        struct cmsg       *last = k ? &out[k - 1] : NULL;
        bool               last_user = last && last->role == DSV4_CHAT_ROLE_USER;
        if (m->role == DSV4_CHAT_ROLE_TOOL) {
            if (!last_user) {
                out[k++] = (struct cmsg){ .role = DSV4_CHAT_ROLE_USER };
                last     = &out[k - 1];
            }
            if ((rc = add_block(r, last, BLOCK_TOOL_RESULT, m->content, m->tool_call_id))) return rc;
        } else if (m->role == DSV4_CHAT_ROLE_USER) {
            if (!last_user || last->task != DSV4_CHAT_TASK_NONE) {
                out[k] = *m; /* keeps task and no_eos, as the official merge does */
                out[k].n_blocks = out[k].cap_blocks = 0;
                out[k].blocks   = NULL;
                last            = &out[k++];
            }
            if ((rc = add_block(r, last, BLOCK_TEXT, m->content, NULL))) return rc;
        } else {
            out[k++] = *m;
        }
    }
    *n_out = k;
    return DSV4_OK;
}

/* The index of the call with this id in the last calling turn (the last one on duplicate
 * ids, as a dict built in order keeps it), 0 when none has it. */
static size_t call_rank(const struct cmsg *calls, const char *id)
{
    size_t rank = 0;
    for (size_t c = 0; c < calls->n_calls; c++)
        if (calls->calls[c].id[0] && strcmp(calls->calls[c].id, id) == 0) rank = c;
    return rank;
}

/* Rule 2: a stable sort of the tool results of a turn by the order of the calls; text
 * blocks keep their places. */
static int sort_tool_results(struct render *r, struct cmsg *msgs, size_t n)
{
    const struct cmsg *calls = NULL; /* last assistant turn with calls */
    for (size_t i = 0; i < n; i++) {
        struct cmsg *m = &msgs[i];
        if (m->role == DSV4_CHAT_ROLE_ASSISTANT && m->n_calls) {
            calls = m;
            continue;
        }
        if (m->role != DSV4_CHAT_ROLE_USER || !calls) continue;
        bool any_id = false;
        for (size_t c = 0; c < calls->n_calls; c++) any_id |= calls->calls[c].id[0] != '\0';
        size_t n_res = 0;
        for (size_t b = 0; b < m->n_blocks; b++) n_res += m->blocks[b].type == BLOCK_TOOL_RESULT;
        if (!any_id || n_res < 2) continue;
        size_t        *slot = ralloc(r, n_res * sizeof(*slot)), *rank = ralloc(r, n_res * sizeof(*rank));
        struct cblock *res  = ralloc(r, n_res * sizeof(*res));
        if (!slot || !rank || !res) return dsv4_err_set(r->err, DSV4_ENOMEM, "out of memory rendering the chat");
        size_t k = 0;
        for (size_t b = 0; b < m->n_blocks; b++) {
            if (m->blocks[b].type != BLOCK_TOOL_RESULT) continue;
            /* insertion sort: stable, and n_res is a handful */
            size_t rk = call_rank(calls, m->blocks[b].tool_use_id), j = k;
            while (j > 0 && rank[j - 1] > rk) {
                rank[j] = rank[j - 1];
                res[j]  = res[j - 1];
                j--;
            }
            rank[j]   = rk;
            res[j]    = m->blocks[b];
            slot[k++] = b;
        }
        for (size_t j = 0; j < n_res; j++) m->blocks[slot[j]] = res[j];
    }
    return DSV4_OK;
}

static bool is_user_like(enum dsv4_chat_role role)
{
    return role == DSV4_CHAT_ROLE_USER || role == DSV4_CHAT_ROLE_DEVELOPER;
}

static long last_user_index(const struct cmsg *m, size_t n)
{
    for (size_t i = n; i-- > 0;)
        if (is_user_like(m[i].role)) return (long)i;
    return -1;
}

/* Rule 4: before the last user turn, assistant turns lose their reasoning and developer
 * turns disappear. */
static size_t drop_thinking(struct cmsg *m, size_t n)
{
    long   last = last_user_index(m, n);
    size_t k    = 0;
    for (size_t i = 0; i < n; i++) {
        enum dsv4_chat_role role = m[i].role;
        bool keep = role == DSV4_CHAT_ROLE_USER || role == DSV4_CHAT_ROLE_SYSTEM || role == DSV4_CHAT_ROLE_TOOL ||
                    role == DSV4_CHAT_ROLE_LATEST_REMINDER || (long)i >= last;
        if (keep) {
            m[k++] = m[i];
        } else if (role == DSV4_CHAT_ROLE_ASSISTANT) {
            m[k]           = m[i];
            m[k].reasoning = NULL;
            k++;
        }
    }
    return k;
}

/* ------------------------------------------------------------------ rendering */

static int render_tools(struct render *r, struct tok_buf *b, const json_t *tools, size_t msg_index)
{
    tok_buf_puts(b, TOOLS_HEAD);
    size_t  i;
    json_t *tool;
    json_array_foreach((json_t *)tools, i, tool) {
        const json_t *fn = json_object_get(tool, "function");
        if (!fn)
            return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: tools[%zu] has no \"function\"", msg_index, i);
        if (i) tok_buf_putc(b, '\n');
        int rc = dump_lit(r, b, fn);
        if (rc) return rc;
    }
    tok_buf_puts(b, TOOLS_TAIL);
    return DSV4_OK;
}

static int render_extras(struct render *r, struct tok_buf *b, const struct cmsg *m, size_t index)
{
    int rc;
    if (json_truthy(m->tools)) {
        tok_buf_puts(b, "\n\n");
        if ((rc = render_tools(r, b, m->tools, index))) return rc;
    }
    if (json_truthy(m->response_format)) {
        tok_buf_puts(b, "\n\n");
        tok_buf_puts(b, RESPONSE_FORMAT_HEAD);
        if ((rc = dump_lit(r, b, m->response_format))) return rc;
    }
    return DSV4_OK;
}

/* One call as DSML: each argument a <parameter>, strings raw, other values as JSON. */
static int render_call(struct render *r, struct tok_buf *b, const struct ccall *c)
{
    tok_buf_puts(b, "<" DSML "invoke name=\"");
    puts_lit(r, b, c->name);
    tok_buf_puts(b, "\">\n");
    const char *key;
    json_t     *v;
    size_t      i = 0;
    if (c->args) {
        json_object_foreach(c->args, key, v) {
            if (i++) tok_buf_putc(b, '\n');
            tok_buf_puts(b, "<" DSML "parameter name=\"");
            puts_lit(r, b, key);
            tok_buf_puts(b, json_is_string(v) ? "\" string=\"true\">" : "\" string=\"false\">");
            if (json_is_string(v)) {
                put_lit(r, b, json_string_value(v), json_string_length(v));
            } else {
                int rc = dump_lit(r, b, v);
                if (rc) return rc;
            }
            tok_buf_puts(b, "</" DSML "parameter>");
        }
    } else { /* not JSON: the whole text as one string argument, as the official does */
        tok_buf_puts(b, "<" DSML "parameter name=\"arguments\" string=\"true\">");
        puts_lit(r, b, c->raw);
        tok_buf_puts(b, "</" DSML "parameter>");
    }
    tok_buf_puts(b, "\n</" DSML "invoke>");
    return DSV4_OK;
}

static int render_message(struct render *r, struct tok_buf *b, const struct cmsg *msgs, size_t n, size_t index,
                          const struct dsv4_chat_params *p, bool drop)
{
    const struct cmsg *m        = &msgs[index];
    bool               thinking = p->mode == DSV4_CHAT_MODE_THINKING;
    long               last     = last_user_index(msgs, n);
    int                rc;

    if (index == 0 && thinking && p->effort == DSV4_CHAT_EFFORT_MAX) tok_buf_puts(b, EFFORT_MAX_TEXT);

    switch (m->role) {
    case DSV4_CHAT_ROLE_SYSTEM:
        if (m->content) puts_lit(r, b, m->content);
        if ((rc = render_extras(r, b, m, index))) return rc;
        break;
    case DSV4_CHAT_ROLE_DEVELOPER:
        if (!m->content || !m->content[0])
            return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: a developer message needs content", index);
        tok_buf_puts(b, USER_TEXT);
        puts_lit(r, b, m->content);
        if ((rc = render_extras(r, b, m, index))) return rc;
        break;
    case DSV4_CHAT_ROLE_USER:
        tok_buf_puts(b, USER_TEXT);
        for (size_t i = 0; i < m->n_blocks; i++) {
            if (i) tok_buf_puts(b, "\n\n");
            if (m->blocks[i].type == BLOCK_TOOL_RESULT) tok_buf_puts(b, "<tool_result>");
            puts_lit(r, b, m->blocks[i].text);
            if (m->blocks[i].type == BLOCK_TOOL_RESULT) tok_buf_puts(b, "</tool_result>");
        }
        break;
    case DSV4_CHAT_ROLE_LATEST_REMINDER:
        if (!m->content)
            return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: a latest_reminder message needs content", index);
        tok_buf_puts(b, REMINDER_TEXT);
        puts_lit(r, b, m->content);
        break;
    case DSV4_CHAT_ROLE_ASSISTANT: {
        bool prev_has_task = index > 0 && msgs[index - 1].task != DSV4_CHAT_TASK_NONE;
        if (thinking && !prev_has_task && (!drop || (long)index > last)) {
            if (m->reasoning) puts_lit(r, b, m->reasoning);
            tok_buf_puts(b, THINK_END);
        }
        if (m->content) puts_lit(r, b, m->content);
        if (m->n_calls) {
            tok_buf_puts(b, "\n\n<" DSML "tool_calls>\n");
            for (size_t c = 0; c < m->n_calls; c++) {
                if (c) tok_buf_putc(b, '\n');
                if ((rc = render_call(r, b, &m->calls[c]))) return rc;
            }
            tok_buf_puts(b, "\n</" DSML "tool_calls>");
        }
        if (!m->no_eos) tok_buf_puts(b, EOS_TEXT);
        break;
    }
    case DSV4_CHAT_ROLE_TOOL: /* merged away before rendering */
    default: return dsv4_err_set(r->err, DSV4_EINTERNAL, "message %zu: unexpected role %d", index, (int)m->role);
    }

    /* The opening of the next turn, unless a non-assistant message follows. */
    if (index + 1 < n && msgs[index + 1].role != DSV4_CHAT_ROLE_ASSISTANT &&
        msgs[index + 1].role != DSV4_CHAT_ROLE_LATEST_REMINDER)
        return DSV4_OK;
    if (m->task != DSV4_CHAT_TASK_NONE) {
        if (m->task != DSV4_CHAT_TASK_ACTION) {
            tok_buf_puts(b, TASK_TEXT[m->task]);
        } else {
            tok_buf_puts(b, ASSISTANT_TEXT);
            tok_buf_puts(b, thinking ? THINK_START : THINK_END);
            tok_buf_puts(b, TASK_TEXT[m->task]);
        }
    } else if (is_user_like(m->role)) {
        tok_buf_puts(b, ASSISTANT_TEXT);
        tok_buf_puts(b, thinking && (!drop || (long)index >= last) ? THINK_START : THINK_END);
    }
    return DSV4_OK;
}

/* Renders the messages into *out; with literal != NULL also the byte mask of request text. */
static int render_all(struct render *r, const struct cmsg *in, size_t n, const struct dsv4_chat_params *params,
                      char **out, size_t *out_len, uint8_t **literal)
{
    struct dsv4_chat_params dflt;
    if (!params) {
        dsv4_chat_params_default(&dflt);
        params = &dflt;
    }
    if (params->mode != DSV4_CHAT_MODE_CHAT && params->mode != DSV4_CHAT_MODE_THINKING)
        return dsv4_err_set(r->err, DSV4_EINVAL, "chat mode %d is neither chat nor thinking", (int)params->mode);
    if (params->effort < DSV4_CHAT_EFFORT_DEFAULT || params->effort > DSV4_CHAT_EFFORT_MAX)
        return dsv4_err_set(r->err, DSV4_EINVAL, "reasoning effort %d is not one of default, high, max",
                            (int)params->effort);
    struct cmsg *msgs = ralloc(r, (n + 1) * sizeof(*msgs));
    if (!msgs) return dsv4_err_set(r->err, DSV4_ENOMEM, "out of memory rendering the chat");
    size_t k;
    int    rc = merge_tool_messages(r, in, n, msgs, &k);
    if (rc || (rc = sort_tool_results(r, msgs, k))) return rc;

    bool drop = !params->keep_reasoning;
    for (size_t i = 0; i < k; i++)
        if (json_truthy(msgs[i].tools)) drop = false;
    if (params->mode == DSV4_CHAT_MODE_THINKING && drop) k = drop_thinking(msgs, k);

    struct tok_buf b = { 0 };
    if (!params->no_bos) tok_buf_puts(&b, BOS_TEXT);
    for (size_t i = 0; i < k && rc == DSV4_OK; i++) rc = render_message(r, &b, msgs, k, i, params, drop);
    if (rc) {
        tok_buf_free(&b);
        return rc;
    }
    size_t len = b.len;
    if (literal) {
        *literal = r->lit_oom ? NULL : calloc(len ? len : 1, 1);
        if (!*literal) {
            tok_buf_free(&b);
            return dsv4_err_set(r->err, DSV4_ENOMEM, "out of memory rendering the chat");
        }
        for (size_t i = 0; i < r->n_lit; i++) memset(*literal + r->lit[2 * i], 1, r->lit[2 * i + 1] - r->lit[2 * i]);
    }
    *out = tok_buf_take(&b, out_len);
    if (!*out) {
        if (literal) {
            free(*literal);
            *literal = NULL;
        }
        return dsv4_err_set(r->err, DSV4_ENOMEM, "out of memory rendering the chat");
    }
    return DSV4_OK;
}

static void render_init(struct render *r, struct dsv4_err *err)
{
    memset(r, 0, sizeof(*r));
    dsv4_arena_init(&r->arena, 1 << 14);
    r->err = err;
}

static void render_fini(struct render *r)
{
    free(r->lit);
    for (size_t i = 0; i < r->n_owned; i++) json_decref(r->owned[i]);
    free(r->owned);
    dsv4_arena_free(&r->arena);
}

/* Arguments as the official encoder reads them: a JSON object, or (not JSON at all) one
 * string; JSON that is not an object is an error there too. */
static int parse_arguments(struct render *r, struct ccall *c, size_t index, size_t ci)
{
    json_t *v = json_loads(c->raw, JSON_DECODE_ANY, NULL);
    if (!v) return DSV4_OK;
    int rc = own(r, v);
    if (rc) return rc;
    if (!json_is_object(v))
        return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: tool call %zu: arguments are JSON but not an object",
                            index, ci);
    c->args = v;
    return DSV4_OK;
}

/* ------------------------------------------------------------------ public: C messages */

void dsv4_chat_params_default(struct dsv4_chat_params *params)
{
    memset(params, 0, sizeof(*params));
    params->mode   = DSV4_CHAT_MODE_CHAT;
    params->effort = DSV4_CHAT_EFFORT_DEFAULT;
}

static int parse_json_field(struct render *r, const char *text, size_t index, const char *field, json_t **out)
{
    *out = NULL;
    if (!text) return DSV4_OK;
    json_error_t jerr;
    json_t      *v = json_loads(text, JSON_DECODE_ANY, &jerr);
    if (!v)
        return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: %s is not JSON (line %d, column %d: %s)", index, field,
                            jerr.line, jerr.column, jerr.text);
    int rc = own(r, v);
    if (rc) return rc;
    *out = v;
    return DSV4_OK;
}

int dsv4_chat_render(const struct dsv4_chat_message *msgs, size_t n_msgs, const struct dsv4_chat_params *params,
                     char **out, size_t *out_len, struct dsv4_err *err)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    if (n_msgs && !msgs) return dsv4_err_set(err, DSV4_EINVAL, "chat render: messages is NULL");
    struct render r;
    render_init(&r, err);
    struct cmsg *cm = ralloc(&r, (n_msgs + 1) * sizeof(*cm));
    int          rc = cm ? DSV4_OK : dsv4_err_set(err, DSV4_ENOMEM, "out of memory rendering the chat");
    for (size_t i = 0; i < n_msgs && rc == DSV4_OK; i++) {
        const struct dsv4_chat_message *m = &msgs[i];
        struct cmsg                    *c = &cm[i];
        if ((unsigned)m->role > DSV4_CHAT_ROLE_LATEST_REMINDER || (unsigned)m->task > DSV4_CHAT_TASK_READ_URL) {
            rc = dsv4_err_set(err, DSV4_EINVAL, "message %zu: unknown role %d or task %d", i, (int)m->role, (int)m->task);
            break;
        }
        *c = (struct cmsg){ .role = m->role, .content = m->content, .reasoning = m->reasoning,
                            .tool_call_id = m->tool_call_id, .task = m->task, .no_eos = m->no_eos };
        if ((rc = parse_json_field(&r, m->tools, i, "tools", &c->tools)) ||
            (rc = parse_json_field(&r, m->response_format, i, "response_format", &c->response_format)))
            break;
        if (c->tools && !json_is_array(c->tools)) {
            rc = dsv4_err_set(err, DSV4_EINVAL, "message %zu: tools must be a JSON array", i);
            break;
        }
        if (m->n_tool_calls && !m->tool_calls) {
            rc = dsv4_err_set(err, DSV4_EINVAL, "message %zu: tool_calls is NULL", i);
            break;
        }
        c->n_calls = m->role == DSV4_CHAT_ROLE_ASSISTANT ? m->n_tool_calls : 0;
        c->calls   = ralloc(&r, (c->n_calls + 1) * sizeof(*c->calls));
        for (size_t k = 0; c->calls && k < c->n_calls && rc == DSV4_OK; k++) {
            const struct dsv4_chat_tool_call *tc = &m->tool_calls[k];
            if (!tc->name) {
                rc = dsv4_err_set(err, DSV4_EINVAL, "message %zu: tool call %zu has no name", i, k);
                break;
            }
            c->calls[k] = (struct ccall){ tc->id ? tc->id : "", tc->name, NULL, tc->arguments ? tc->arguments : "{}" };
            rc          = parse_arguments(&r, &c->calls[k], i, k);
        }
        if (!c->calls && rc == DSV4_OK) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory rendering the chat");
    }
    if (rc == DSV4_OK) rc = render_all(&r, cm, n_msgs, params, out, out_len, NULL);
    render_fini(&r);
    return rc;
}

/* ------------------------------------------------------------------ public: OpenAI JSON */

/* Text of a content value: a string, null, or a list of {"type": "text", "text": ...}
 * parts (joined with sep; other part types become "[Unsupported TYPE]" when unsupported is
 * set, as the official encoder writes them inside tool results, else an error). */
static int content_text(struct render *r, const json_t *v, const char *sep, bool unsupported, size_t index,
                        const char **out)
{
    *out = NULL;
    if (!v || json_is_null(v)) return DSV4_OK;
    if (json_is_string(v)) {
        if (strlen(json_string_value(v)) != json_string_length(v))
            return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: content holds a NUL character", index);
        *out = json_string_value(v);
        return DSV4_OK;
    }
    if (!json_is_array(v))
        return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: content must be a string, null or a list of parts", index);
    struct tok_buf b = { 0 };
    size_t         i;
    json_t        *part;
    json_array_foreach((json_t *)v, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const char *text = json_string_value(json_object_get(part, "text"));
        if (i) tok_buf_puts(&b, sep);
        if (type && strcmp(type, "text") == 0) {
            if (text) tok_buf_puts(&b, text);
        } else if (unsupported) {
            tok_buf_puts(&b, "[Unsupported ");
            tok_buf_puts(&b, type ? type : "None");
            tok_buf_puts(&b, "]");
        } else {
            tok_buf_free(&b);
            return dsv4_err_set(r->err, DSV4_EUNSUPPORTED, "message %zu: content part %zu of type \"%s\" is not supported",
                                index, i, type ? type : "?");
        }
    }
    size_t len;
    char  *s = tok_buf_take(&b, &len);
    char  *a = s ? ralloc(r, len + 1) : NULL;
    if (a) memcpy(a, s, len + 1);
    free(s);
    if (!a) return dsv4_err_set(r->err, DSV4_ENOMEM, "out of memory rendering the chat");
    *out = a;
    return DSV4_OK;
}

static int opt_string(struct render *r, const json_t *obj, const char *key, size_t index, const char **out)
{
    const json_t *v = json_object_get(obj, key);
    *out            = NULL;
    if (!v || json_is_null(v)) return DSV4_OK;
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: \"%s\" must be a string", index, key);
    *out = json_string_value(v);
    return DSV4_OK;
}

static int json_message(struct render *r, json_t *jm, size_t index, struct cmsg *c)
{
    static const char *const roles[] = { "system", "user", "assistant", "tool", "developer", "latest_reminder" };
    if (!json_is_object(jm)) return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu is not an object", index);
    const char *role = json_string_value(json_object_get(jm, "role"));
    int         ri   = -1;
    for (int i = 0; role && i < (int)DSV4_ARRAY_LEN(roles); i++)
        if (strcmp(role, roles[i]) == 0) ri = i;
    if (ri < 0)
        return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: unknown role \"%s\"", index, role ? role : "(none)");
    memset(c, 0, sizeof(*c));
    c->role = (enum dsv4_chat_role)ri;
    int rc;
    if ((rc = content_text(r, json_object_get(jm, "content"), ri == DSV4_CHAT_ROLE_TOOL ? "\n\n" : "",
                           ri == DSV4_CHAT_ROLE_TOOL, index, &c->content)) ||
        (rc = opt_string(r, jm, "reasoning_content", index, &c->reasoning)) ||
        (rc = opt_string(r, jm, "tool_call_id", index, &c->tool_call_id)))
        return rc;
    if (!c->reasoning && (rc = opt_string(r, jm, "reasoning", index, &c->reasoning))) return rc;
    json_t *tools = json_object_get(jm, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: tools must be an array", index);
        c->tools = tools;
    }
    c->response_format = json_object_get(jm, "response_format");
    const char *task   = json_string_value(json_object_get(jm, "task"));
    if (task) {
        for (int t = 1; t < (int)DSV4_ARRAY_LEN(TASK_NAME); t++)
            if (strcmp(task, TASK_NAME[t]) == 0) c->task = (enum dsv4_chat_task)t;
        if (c->task == DSV4_CHAT_TASK_NONE)
            return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: unknown task \"%s\"", index, task);
    }
    c->no_eos      = json_is_true(json_object_get(jm, "wo_eos"));
    json_t *calls  = json_object_get(jm, "tool_calls");
    size_t  n_call = json_is_array(calls) && ri == DSV4_CHAT_ROLE_ASSISTANT ? json_array_size(calls) : 0;
    c->calls       = ralloc(r, (n_call + 1) * sizeof(*c->calls));
    if (!c->calls) return dsv4_err_set(r->err, DSV4_ENOMEM, "out of memory rendering the chat");
    c->n_calls = n_call;
    for (size_t k = 0; k < n_call; k++) {
        json_t     *tc   = json_array_get(calls, k);
        json_t     *fn   = json_object_get(tc, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t     *args = json_object_get(fn, "arguments");
        const char *id   = json_string_value(json_object_get(tc, "id"));
        if (!id || !id[0]) id = json_string_value(json_object_get(fn, "id"));
        if (!name) return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: tool_calls[%zu] has no function.name", index, k);
        c->calls[k] = (struct ccall){ id ? id : "", name, NULL, "" };
        if (json_is_string(args)) {
            c->calls[k].raw = json_string_value(args);
            if ((rc = parse_arguments(r, &c->calls[k], index, k))) return rc;
        } else if (json_is_object(args)) {
            c->calls[k].args = args;
        } else {
            return dsv4_err_set(r->err, DSV4_EINVAL, "message %zu: tool_calls[%zu].function.arguments must be a string or an object",
                                index, k);
        }
    }
    return DSV4_OK;
}

static int render_json(const char *json, size_t len, const struct dsv4_chat_params *params, char **out,
                       size_t *out_len, uint8_t **literal, struct dsv4_err *err);

int dsv4_chat_render_json(const char *json, size_t len, const struct dsv4_chat_params *params, char **out,
                          size_t *out_len, struct dsv4_err *err)
{
    return render_json(json, len, params, out, out_len, NULL, err);
}

int dsv4_chat_render_json_marked(const char *json, size_t len, const struct dsv4_chat_params *params,
                                 char **out, size_t *out_len, uint8_t **literal, struct dsv4_err *err)
{
    *literal = NULL;
    return render_json(json, len, params, out, out_len, literal, err);
}

static int render_json(const char *json, size_t len, const struct dsv4_chat_params *params, char **out,
                       size_t *out_len, uint8_t **literal, struct dsv4_err *err)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    struct render r;
    render_init(&r, err);
    json_error_t jerr;
    json_t      *root = json ? json_loadb(json, len, 0, &jerr) : NULL;
    int          rc;
    if (!root) {
        rc = dsv4_err_set(err, DSV4_EINVAL, "chat messages are not JSON (line %d, column %d: %s)", json ? jerr.line : 0,
                          json ? jerr.column : 0, json ? jerr.text : "no text");
        render_fini(&r);
        return rc;
    }
    rc               = own(&r, root);
    json_t *messages = json_is_array(root) ? root : json_object_get(root, "messages");
    json_t *tools    = json_is_object(root) ? json_object_get(root, "tools") : NULL;
    if (rc == DSV4_OK && !json_is_array(messages))
        rc = dsv4_err_set(err, DSV4_EINVAL, "chat JSON must be an array of messages or an object with \"messages\"");
    size_t       n  = rc ? 0 : json_array_size(messages);
    struct cmsg *cm = ralloc(&r, (n + 1) * sizeof(*cm));
    if (rc == DSV4_OK && !cm) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory rendering the chat");
    for (size_t i = 0; i < n && rc == DSV4_OK; i++) rc = json_message(&r, json_array_get(messages, i), i, &cm[i]);
    if (rc == DSV4_OK && tools && !json_is_null(tools)) {
        if (!n) rc = dsv4_err_set(err, DSV4_EINVAL, "chat JSON has tools but no message to attach them to");
        else if (!json_is_array(tools)) rc = dsv4_err_set(err, DSV4_EINVAL, "chat JSON: tools must be an array");
        else cm[0].tools = tools;
    }
    if (rc == DSV4_OK) rc = render_all(&r, cm, n, params, out, out_len, literal);
    render_fini(&r);
    return rc;
}
