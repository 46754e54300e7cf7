/*
 * dsml.c - generated text -> reasoning, content and tool calls: the reverse of chat.c, with
 * the rules of parse_message_from_completion_text in the official encoding_dsv4.py.
 *
 * A turn is [reasoning "</think>"] content ["\n\n<｜DSML｜tool_calls" block] [EOS text],
 * the reasoning part only in thinking mode. The block is
 *
 *   >\n<｜DSML｜invoke name="NAME">\n
 *   <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>\n ...
 *   </｜DSML｜invoke>\n ... </｜DSML｜tool_calls>
 *
 * and each call's arguments become the JSON text the official parser builds: string values
 * quoted (json.dumps), the others copied as written.
 *
 * One engine serves both uses. The streaming parser keeps only the text that might still be
 * the start of a marker ("</thi" could become "</think>") and reports everything before it
 * at once, so a client sees reasoning and content as they are generated; a tool call is
 * reported when its closing tag arrives. dsv4_chat_parse feeds a whole turn and then applies
 * the official parser's remaining checks (EOS required unless the turn ends in tool calls,
 * no special token inside the text). Markers are found by byte search on UTF-8, which is
 * exact because every marker starts with an ASCII byte.
 */
#include <stdlib.h>
#include <string.h>

#include "tok/tok.h"

#define M_THINK_END  "</think>"
#define M_TC_START   "\n\n<｜DSML｜tool_calls"
#define M_EOS        "<｜end▁of▁sentence｜>"
#define M_INVOKE     "<｜DSML｜invoke"
#define M_TC_END     "</｜DSML｜tool_calls>"
#define M_PARAM      "<｜DSML｜parameter"
#define M_INVOKE_END "</｜DSML｜invoke"
#define M_PARAM_END  "/｜DSML｜parameter"

enum state {
    ST_REASONING,   /* thinking mode, before </think> */
    ST_CONTENT,     /* before EOS or the tool-call block */
    ST_TOOLS,       /* inside the block (see enum tstate) */
    ST_AFTER_TOOLS, /* after </｜DSML｜tool_calls>: only EOS may follow */
    ST_DONE,        /* after EOS: nothing may follow */
    ST_FAILED,
};

enum tstate {
    T_SEP,       /* ">\n" then <invoke or </tool_calls> */
    T_NAME,      /* ' name="NAME">\n' then <parameter or </invoke */
    T_PARAM,     /* ' name="K" string="B">VALUE<' then /parameter */
    T_PARAM_SEP, /* ">\n" then <parameter or </invoke */
};

struct dsv4_chat_stream {
    enum dsv4_chat_mode mode;
    dsv4_chat_event_fn  fn;
    void               *ud;
    enum state          st;
    enum tstate         ts;
    struct tok_buf      buf; /* unconsumed text */
    size_t              n_calls;
    bool                saw_eos;
    bool                saw_tools;
    bool                eos_in_reasoning; /* the turn ended before </think> */
    /* the call being read */
    struct tok_buf  name;
    struct tok_buf  args;  /* "{" + "key": value pairs so far */
    struct tok_buf  keys;  /* parameter names so far, each NUL-terminated (duplicate check) */
    size_t          n_args;
    struct dsv4_err fail;  /* the sticky error of a failed stream */
};

/* ------------------------------------------------------------------ markers */

struct found {
    int    which; /* index into the marker list, -1 when none is final yet */
    size_t at;    /* where it starts */
    size_t hold;  /* text from here on may be the start of a marker: not final */
};

/* The earliest complete marker in s[0..n) (ties: the first in the list, as the official
 * parser's search does) and the start of the longest tail that is a proper prefix of one. */
static struct found find_marker(const char *s, size_t n, const char *const *mk, int n_mk)
{
    struct found f = { -1, n, n };
    for (int i = 0; i < n_mk; i++) {
        size_t      ml = strlen(mk[i]);
        const char *p  = ml <= n ? memmem(s, n, mk[i], ml) : NULL;
        if (p && (size_t)(p - s) < f.at) {
            f.at    = (size_t)(p - s);
            f.which = i;
        }
        for (size_t k = ml - 1; k > 0; k--) /* tail of length k == marker prefix */
            if (k <= n && n - k < f.hold && memcmp(s + n - k, mk[i], k) == 0) f.hold = n - k;
    }
    if (f.which >= 0 && f.hold < f.at) f.which = -1; /* an earlier marker may still be forming */
    if (f.which < 0) f.at = n;
    return f;
}

/* ------------------------------------------------------------------ events */

static void emit_text(struct dsv4_chat_stream *s, enum dsv4_chat_event_kind kind, const char *t, size_t n)
{
    if (n == 0) return;
    struct dsv4_chat_event ev = { kind, t, n, 0, NULL, NULL };
    s->fn(s->ud, &ev);
}

/* Fails the stream: what, then the offending text (shortened) when there is some. */
static int fail(struct dsv4_chat_stream *s, const char *what, const char *detail, size_t n)
{
    s->st = ST_FAILED;
    if (n > 60) n = 60;
    dsv4_err_set(&s->fail, DSV4_EFORMAT, "%s%s%.*s%s", what, n ? " \"" : "", (int)n, detail, n ? "\"" : "");
    return DSV4_EFORMAT;
}

static void consume(struct dsv4_chat_stream *s, size_t n)
{
    /* nothing to drop: also the case of a stream fed only empty text so far, whose buffer is
     * still NULL, where memmove(NULL, NULL + 0, 0) is undefined (UBSan, tests/fuzz/fuzz_chat.c) */
    if (n == 0) return;
    memmove(s->buf.p, s->buf.p + n, s->buf.len - n);
    s->buf.len -= n;
}

/* ------------------------------------------------------------------ tool calls */

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* `^\s*name="(.*?)">\n$`: the name of an invoke. */
static bool parse_invoke_name(const char *s, size_t n, size_t *name_at, size_t *name_len)
{
    size_t i = 0;
    while (i < n && is_space(s[i])) i++;
    if (n - i < 6 || memcmp(s + i, "name=\"", 6) != 0) return false;
    i += 6;
    /* the shortest name after which '">\n' ends the text ($ also allows one final \n) */
    for (size_t j = i; j + 3 <= n; j++) {
        if (memcmp(s + j, "\">\n", 3) == 0 && (j + 3 == n || (j + 4 == n && s[n - 1] == '\n'))) {
            *name_at  = i;
            *name_len = j - i;
            return true;
        }
    }
    return false;
}

/* `^ name="(.*?)" string="(true|false)">(.*?)<$`: one parameter. */
static bool parse_param(const char *s, size_t n, size_t *key_at, size_t *key_len, bool *is_str, size_t *val_at,
                        size_t *val_len)
{
    if (n < 7 || memcmp(s, " name=\"", 7) != 0) return false;
    size_t end = n; /* the value ends at a final '<' ($ allows one more \n) */
    if (end >= 2 && s[end - 1] == '\n' && s[end - 2] == '<') end -= 2;
    else if (end >= 1 && s[end - 1] == '<') end -= 1;
    else return false;
    for (size_t j = 7; j < end; j++) {
        static const char *const flag[2] = { "\" string=\"true\">", "\" string=\"false\">" };
        for (int f = 0; f < 2; f++) {
            size_t fl = strlen(flag[f]);
            if (j + fl <= end && memcmp(s + j, flag[f], fl) == 0) {
                *key_at  = 7;
                *key_len = j - 7;
                *is_str  = f == 0;
                *val_at  = j + fl;
                *val_len = end - (j + fl);
                return true;
            }
        }
    }
    return false;
}

static void call_begin(struct dsv4_chat_stream *s, const char *name, size_t n)
{
    s->name.len = s->args.len = s->keys.len = 0;
    s->n_args                                = 0;
    tok_buf_put(&s->name, name, n);
    tok_buf_putc(&s->args, '{');
}

static int call_param(struct dsv4_chat_stream *s, const char *key, size_t kn, bool is_str, const char *val, size_t vn)
{
    for (size_t o = 0; o < s->keys.len; o += strlen(s->keys.p + o) + 1)
        if (strlen(s->keys.p + o) == kn && memcmp(s->keys.p + o, key, kn) == 0)
            return fail(s, "duplicate tool-call parameter", key, kn);
    tok_buf_put(&s->keys, key, kn);
    tok_buf_putc(&s->keys, '\0');
    if (s->n_args++) tok_buf_puts(&s->args, ", ");
    tok_pyjson_string(&s->args, key, kn);
    tok_buf_puts(&s->args, ": ");
    if (is_str) tok_pyjson_string(&s->args, val, vn);
    else tok_buf_put(&s->args, val, vn);
    return DSV4_OK;
}

static int call_end(struct dsv4_chat_stream *s)
{
    tok_buf_putc(&s->args, '}');
    tok_buf_putc(&s->args, '\0');
    tok_buf_putc(&s->name, '\0');
    if (s->args.oom || s->name.oom || s->keys.oom) {
        s->st = ST_FAILED;
        return dsv4_err_set(&s->fail, DSV4_ENOMEM, "out of memory parsing a tool call");
    }
    struct dsv4_chat_event ev = { DSV4_CHAT_EVENT_TOOL_CALL, NULL, 0, s->n_calls, s->name.p, s->args.p };
    s->n_calls++;
    s->fn(s->ud, &ev);
    return DSV4_OK;
}

/* One step inside the block; returns 1 after progress, 0 when more text is needed. */
static int tools_step(struct dsv4_chat_stream *s)
{
    static const char *const sep_mk[]   = { M_INVOKE, M_TC_END };
    static const char *const name_mk[]  = { M_PARAM, M_INVOKE_END };
    static const char *const param_mk[] = { M_PARAM_END };
    const char              *t          = s->buf.p;
    struct found             f;
    int                      rc;
    switch (s->ts) {
    case T_SEP:
    case T_PARAM_SEP:
        f = s->ts == T_SEP ? find_marker(t, s->buf.len, sep_mk, 2) : find_marker(t, s->buf.len, name_mk, 2);
        if (f.which < 0) {
            /* fail early when the separator can no longer be ">\n" */
            size_t k = s->buf.len < 2 ? s->buf.len : 2;
            if (memcmp(t, ">\n", k) != 0) return fail(s, "tool-call block: expected \">\\n\", got", t, s->buf.len);
            return 0;
        }
        if (f.at != 2 || memcmp(t, ">\n", 2) != 0) return fail(s, "tool-call block: expected \">\\n\", got", t, f.at);
        size_t adv = f.at + strlen((s->ts == T_SEP ? sep_mk : name_mk)[f.which]);
        if (s->ts == T_SEP && f.which == 1) {
            s->st = ST_AFTER_TOOLS;
        } else if (s->ts == T_SEP) {
            s->ts = T_NAME;
        } else if (f.which == 0) {
            s->ts = T_PARAM;
        } else {
            if ((rc = call_end(s))) return rc;
            s->ts = T_SEP;
        }
        consume(s, adv);
        return 1;
    case T_NAME: {
        f = find_marker(t, s->buf.len, name_mk, 2);
        if (f.which < 0) return 0;
        size_t at, len;
        if (!parse_invoke_name(t, f.at, &at, &len)) return fail(s, "tool-call name: cannot read", t, f.at);
        call_begin(s, t + at, len);
        if (f.which == 0) {
            s->ts = T_PARAM;
        } else {
            if ((rc = call_end(s))) return rc;
            s->ts = T_SEP;
        }
        consume(s, f.at + strlen(name_mk[f.which]));
        return 1;
    }
    case T_PARAM: {
        f = find_marker(t, s->buf.len, param_mk, 1);
        if (f.which < 0) return 0;
        size_t ka, kl, va, vl;
        bool   is_str;
        if (!parse_param(t, f.at, &ka, &kl, &is_str, &va, &vl))
            return fail(s, "tool-call parameter: cannot read", t, f.at);
        if ((rc = call_param(s, t + ka, kl, is_str, t + va, vl))) return rc;
        s->ts = T_PARAM_SEP;
        consume(s, f.at + strlen(M_PARAM_END));
        return 1;
    }
    }
    return 0;
}

/* ------------------------------------------------------------------ the state machine */

static int step(struct dsv4_chat_stream *s)
{
    /* EOS inside the reasoning ends the turn there (a model that stops thinking without
     * </think>): the reasoning is closed, the EOS text is never reported */
    static const char *const reasoning_mk[] = { M_THINK_END, M_TC_START, M_EOS };
    static const char *const content_mk[]   = { M_EOS, M_TC_START };
    const char              *t              = s->buf.p;
    size_t                   n              = s->buf.len;
    struct found             f;
    switch (s->st) {
    case ST_REASONING:
    case ST_CONTENT: {
        bool                      r    = s->st == ST_REASONING;
        enum dsv4_chat_event_kind kind = r ? DSV4_CHAT_EVENT_REASONING : DSV4_CHAT_EVENT_CONTENT;
        f = find_marker(t, n, r ? reasoning_mk : content_mk, r ? 3 : 2);
        if (f.which < 0) {
            emit_text(s, kind, t, f.hold);
            consume(s, f.hold);
            return 0;
        }
        if (r && f.which == 1)
            return fail(s, "a tool-call block inside the reasoning (no </think> before it)", "", 0);
        emit_text(s, kind, t, f.at);
        consume(s, f.at + strlen((r ? reasoning_mk : content_mk)[f.which]));
        if (r && f.which == 2) {
            s->st               = ST_DONE;
            s->saw_eos          = true;
            s->eos_in_reasoning = true;
        } else if (r) {
            s->st = ST_CONTENT;
        } else if (f.which == 0) {
            s->st      = ST_DONE;
            s->saw_eos = true;
        } else {
            s->st        = ST_TOOLS;
            s->ts        = T_SEP;
            s->saw_tools = true;
        }
        return 1;
    }
    case ST_TOOLS: return tools_step(s);
    case ST_AFTER_TOOLS: {
        size_t el = strlen(M_EOS), k = n < el ? n : el;
        if (memcmp(t, M_EOS, k) != 0) return fail(s, "unexpected text after the tool calls:", t, n);
        if (n < el) return 0;
        consume(s, el);
        s->st      = ST_DONE;
        s->saw_eos = true;
        return 1;
    }
    case ST_DONE:
        if (n) return fail(s, "text after the end of sentence:", t, n);
        return 0;
    case ST_FAILED: return DSV4_EFORMAT;
    }
    return 0;
}

static int sticky(struct dsv4_chat_stream *s, struct dsv4_err *err)
{
    if (err) *err = s->fail;
    return s->fail.code;
}

int dsv4_chat_stream_init(dsv4_chat_stream **out, enum dsv4_chat_mode mode, dsv4_chat_event_fn fn, void *ud,
                          struct dsv4_err *err)
{
    *out = NULL;
    if (!fn) return dsv4_err_set(err, DSV4_EINVAL, "chat stream: no event callback");
    if (mode != DSV4_CHAT_MODE_CHAT && mode != DSV4_CHAT_MODE_THINKING)
        return dsv4_err_set(err, DSV4_EINVAL, "chat stream: mode %d is neither chat nor thinking", (int)mode);
    struct dsv4_chat_stream *s = calloc(1, sizeof(*s));
    if (!s) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for a chat stream");
    s->mode = mode;
    s->fn   = fn;
    s->ud   = ud;
    s->st   = mode == DSV4_CHAT_MODE_THINKING ? ST_REASONING : ST_CONTENT;
    *out    = s;
    return DSV4_OK;
}

int dsv4_chat_stream_feed(dsv4_chat_stream *s, const char *text, size_t len, struct dsv4_err *err)
{
    if (s->st == ST_FAILED) return sticky(s, err);
    tok_buf_put(&s->buf, text, len);
    if (s->buf.oom) {
        s->st = ST_FAILED;
        dsv4_err_set(&s->fail, DSV4_ENOMEM, "out of memory buffering generated text");
        return sticky(s, err);
    }
    int rc;
    while ((rc = step(s)) > 0) {}
    return rc < 0 ? sticky(s, err) : DSV4_OK;
}

int dsv4_chat_stream_finish(dsv4_chat_stream *s, struct dsv4_chat_stream_end *end, struct dsv4_err *err)
{
    if (end) memset(end, 0, sizeof(*end));
    if (s->st == ST_FAILED) return sticky(s, err);
    bool truncated = false;
    switch (s->st) {
    case ST_REASONING: /* the held-back tail was text after all */
    case ST_CONTENT:
        /* ...unless it is the opening of a tool-call block cut short ("\n\n<｜DSML｜to"): that
         * is a call that never came, not text ("\n\n" or "\n\n<" alone stay text) */
        if (s->st == ST_CONTENT && s->buf.len > 3 && s->buf.len < strlen(M_TC_START) &&
            !memcmp(s->buf.p, M_TC_START, s->buf.len)) {
            consume(s, s->buf.len);
            truncated = true;
            break;
        }
        emit_text(s, s->st == ST_REASONING ? DSV4_CHAT_EVENT_REASONING : DSV4_CHAT_EVENT_CONTENT, s->buf.p, s->buf.len);
        consume(s, s->buf.len);
        truncated = s->st == ST_REASONING;
        break;
    case ST_TOOLS: truncated = true; break;
    case ST_AFTER_TOOLS:
        if (s->buf.len) {
            fail(s, "unexpected text after the tool calls:", s->buf.p, s->buf.len);
            return sticky(s, err);
        }
        break;
    case ST_DONE:
    case ST_FAILED: break;
    }
    if (end) {
        end->saw_eos   = s->saw_eos;
        end->truncated = truncated;
        end->n_calls   = s->n_calls;
    }
    return DSV4_OK;
}

void dsv4_chat_stream_free(dsv4_chat_stream *s)
{
    if (!s) return;
    tok_buf_free(&s->buf);
    tok_buf_free(&s->name);
    tok_buf_free(&s->args);
    tok_buf_free(&s->keys);
    free(s);
}

/* ------------------------------------------------------------------ one-shot parse */

struct collect {
    struct tok_buf         reasoning, content;
    struct dsv4_chat_call *calls;
    size_t                 n_calls;
    bool                   oom;
};

static void collect_event(void *ud, const struct dsv4_chat_event *ev)
{
    struct collect *c = ud;
    if (ev->kind == DSV4_CHAT_EVENT_REASONING) {
        tok_buf_put(&c->reasoning, ev->text, ev->len);
    } else if (ev->kind == DSV4_CHAT_EVENT_CONTENT) {
        tok_buf_put(&c->content, ev->text, ev->len);
    } else {
        struct dsv4_chat_call *nc = realloc(c->calls, (c->n_calls + 1) * sizeof(*nc));
        char                  *name = strdup(ev->name), *args = strdup(ev->arguments);
        if (!nc || !name || !args) {
            if (nc) c->calls = nc;
            free(name);
            free(args);
            c->oom = true;
            return;
        }
        c->calls                = nc;
        c->calls[c->n_calls++] = (struct dsv4_chat_call){ name, args };
    }
}

void dsv4_chat_parsed_free(struct dsv4_chat_parsed *p)
{
    if (!p) return;
    free(p->reasoning);
    free(p->content);
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    memset(p, 0, sizeof(*p));
}

int dsv4_chat_parse(const char *text, size_t len, enum dsv4_chat_mode mode, struct dsv4_chat_parsed *out,
                    struct dsv4_err *err)
{
    memset(out, 0, sizeof(*out));
    struct collect           c = { 0 };
    struct dsv4_chat_stream *s;
    int                      rc = dsv4_chat_stream_init(&s, mode, collect_event, &c, err);
    if (rc) return rc;
    struct dsv4_chat_stream_end end;
    rc = dsv4_chat_stream_feed(s, text, len, err);
    if (rc == DSV4_OK) rc = dsv4_chat_stream_finish(s, &end, err);
    bool in_reasoning = s->st == ST_REASONING || s->eos_in_reasoning;
    bool saw_tools    = s->saw_tools;
    dsv4_chat_stream_free(s);
    out->reasoning = tok_buf_take(&c.reasoning, &out->reasoning_len);
    out->content   = tok_buf_take(&c.content, &out->content_len);
    out->calls     = c.calls;
    out->n_calls   = c.n_calls;
    if (rc == DSV4_OK && (!out->reasoning || !out->content || c.oom))
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory parsing the generated text");
    /* the official parser's own checks on a complete turn */
    if (rc == DSV4_OK && in_reasoning) rc = dsv4_err_set(err, DSV4_EFORMAT, "invalid thinking format: missing </think>");
    if (rc == DSV4_OK && end.truncated) rc = dsv4_err_set(err, DSV4_EFORMAT, "the tool-call block is not closed");
    if (rc == DSV4_OK && !saw_tools && !end.saw_eos)
        rc = dsv4_err_set(err, DSV4_EFORMAT, "invalid format: missing the end-of-sentence token");
    static const char *const special[] = { "<｜begin▁of▁sentence｜>", M_EOS, "<think>", M_THINK_END, "｜DSML｜" };
    for (size_t i = 0; rc == DSV4_OK && i < DSV4_ARRAY_LEN(special); i++) {
        size_t k = strlen(special[i]);
        if (memmem(out->content, out->content_len, special[i], k) ||
            memmem(out->reasoning, out->reasoning_len, special[i], k))
            rc = dsv4_err_set(err, DSV4_EFORMAT, "unexpected special token '%s' in the content", special[i]);
    }
    if (rc) dsv4_chat_parsed_free(out);
    return rc;
}
