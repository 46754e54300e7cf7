/*
 * api_output.c - generated tokens -> OpenAI responses: the streaming detokenizer, stop
 * strings, the DSML parser (reasoning_content, content, tool_calls), logprobs, usage, and
 * the two output forms: SSE chunks as tokens arrive, or one JSON body at the end.
 *
 * The pipeline per token, in order:
 *   1. count it and record its logprobs (they belong to the token even if its text is
 *      held back);
 *   2. streaming detokenizer: only whole UTF-8 characters come out;
 *   3. stop strings: text that could still be the start of a stop string is held back
 *      (at a character boundary); a match ends the output before the stop string, and the
 *      caller cancels the job;
 *   4. chat: the DSML stream parser splits reasoning, content and tool calls (each call
 *      is reported whole when its closing tag arrives, so a stream carries every call as
 *      one delta with its complete arguments). Should the model write malformed DSML, or a
 *      call be cut off (max_tokens), the rest of the turn from there is dropped: no byte of
 *      markup reaches the text.
 * When the model ends its turn (EOS), the EOS text is fed to the parser so it can tell a
 * finished turn from a cut one.
 *
 * Control tokens (every added token of tokenizer.json: BOS, EOS, <｜User｜>, <think>, ...)
 * have no text in the output, as skip_special_tokens does in vLLM but for the chat-format
 * tokens too, which tokenizer.json does not mark special: a model that writes
 * "<｜User｜>" cannot make a client see a turn marker. The parser still gets the two it
 * reads: the first </think> of a thinking turn and ｜DSML｜. Logprobs keep every token.
 * skip_special_tokens: false in the request passes them all through as text.
 *
 * One srv_out belongs to one request and is used by its connection thread only.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/server.h"

struct srv_out {
    enum srv_api_kind     kind;
    bool                  stream, include_usage, logprobs, ids_as_text, token_ids, parse_chat;
    int                   top_logprobs;
    int                   n_prompt;
    char                  id[40];
    long long             created;
    const char           *model;
    int                   n_stop;
    char                  stop[SRV_MAX_STOP][SRV_MAX_STOP_LEN + 1];
    size_t                hold;     /* longest stop string - 1: bytes that may still start one */
    const dsv4_tokenizer *tok;      /* NULL: ids only */
    int32_t               eos;
    int32_t               think_end, dsml; /* ids of "</think>" and "｜DSML｜", -1 if none */
    bool                  keep_special;    /* skip_special_tokens: false */
    bool                  think_open;      /* thinking mode before the first </think> */

    struct dsv4_tokenizer_stream ts;
    char                        *tbuf; /* one token's text */
    size_t                       tcap;
    struct srv_buf               pend;    /* decoded text held back for stop strings */
    bool                         stopped; /* a stop string matched */
    int                          stop_hit; /* which one */
    struct srv_anth_stream       anth;     /* Anthropic streams: the open content block */
    struct srv_resp_stream       resp;     /* Responses: the output items */
    int                          n_reason; /* tokens generated while thinking */
    json_t                      *echo, *conv; /* Responses: see struct srv_gen */
    bool                         store;
    struct srv_resp_store       *responses;
    struct srv_turns            *turns;      /* chats: this turn's tokens are kept there at the end */
    int32_t                     *prompt_ids; /* chats: the prompt, then the tokens generated */
    int32_t                     *gen_ids;
    int                          n_gen, gen_cap;
    int                          choice, n_choices; /* index of n (srv_out_set_choice) */
    int                          n_tok;   /* tokens consumed */
    dsv4_chat_stream            *cs;
    bool                         cs_failed;

    /* The response so far (whole body) or the delta of the next chunk (streaming). */
    struct srv_buf content, reasoning;
    json_t        *calls;     /* tool calls */
    int            n_calls;
    json_t        *lp;        /* chat: [entries]; completions: {tokens, token_logprobs, ...} */
    json_t        *ids;       /* token ids (completions with token_ids) */
    size_t         text_off;  /* completions logprobs: bytes of text before the next token */
};

/* ------------------------------------------------------------------ buffers */

static void grow(struct srv_buf *b, size_t need)
{
    if (b->oom || b->len + need + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + need + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return;
    }
    b->p   = p;
    b->cap = cap;
}

void srv_buf_put(struct srv_buf *b, const void *s, size_t n)
{
    grow(b, n);
    if (b->oom) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void srv_buf_puts(struct srv_buf *b, const char *s)
{
    srv_buf_put(b, s, strlen(s));
}

void srv_buf_printf(struct srv_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    grow(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void srv_buf_free(struct srv_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ------------------------------------------------------------------ JSON helpers */

/* Length of the valid UTF-8 sequence at s (1 to 4), or 0 if the byte starts none. */
size_t srv_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t   k;
    unsigned min;
    if ((c & 0xe0) == 0xc0) k = 2, min = 0x80;
    else if ((c & 0xf0) == 0xe0) k = 3, min = 0x800;
    else if ((c & 0xf8) == 0xf0) k = 4, min = 0x10000;
    else return 0;
    if (k > n) return 0;
    unsigned cp = c & (0x7f >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return k;
}

/* A JSON string of s[0..n), each invalid byte replaced by U+FFFD (token pieces may be
 * parts of a character). */
json_t *srv_json_str(const char *s, size_t n)
{
    json_t *v = json_stringn(s, n);
    if (v) return v;
    struct srv_buf b = { 0 };
    for (size_t i = 0; i < n;) {
        size_t k = srv_utf8_seq((const unsigned char *)s + i, n - i);
        if (k) {
            srv_buf_put(&b, s + i, k);
            i += k;
        } else {
            srv_buf_puts(&b, "\xef\xbf\xbd");
            i++;
        }
    }
    v = b.oom ? json_string("") : json_stringn(b.p ? b.p : "", b.len);
    srv_buf_free(&b);
    return v;
}

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

static void emit(struct srv_out *o, const char *s, size_t n);

static struct srv_resp_out resp_out(const struct srv_out *o, int n_cached)
{
    return (struct srv_resp_out){ .id = o->id, .model = o->model, .created = o->created, .reasoning = &o->reasoning,
                                  .content = &o->content, .calls = o->calls, .echo = o->echo, .conv = o->conv,
                                  .store = o->store, .responses = o->responses, .n_prompt = o->n_prompt,
                                  .n_cached = n_cached, .n_out = o->n_tok, .n_reason = o->n_reason };
}

/* ------------------------------------------------------------------ lifecycle */

static void on_chat_event(void *ud, const struct dsv4_chat_event *ev)
{
    struct srv_out *o = ud;
    if (o->cs_failed) return;
    if (ev->kind == DSV4_CHAT_EVENT_REASONING || ev->kind == DSV4_CHAT_EVENT_CONTENT) {
        /* DSML markup outside a well-formed block (the parser passes it as text) ends the
         * output there, as malformed DSML does (see emit) */
        const char *mark = memmem(ev->text, ev->len, "｜DSML｜", strlen("｜DSML｜"));
        size_t      n    = mark ? (size_t)(mark - ev->text) : ev->len;
        if (mark && n > 0 && ev->text[n - 1] == '<') n--;
        if (mark) o->cs_failed = true;
        srv_buf_put(ev->kind == DSV4_CHAT_EVENT_REASONING ? &o->reasoning : &o->content, ev->text, n);
    } else {
        char id[40];
        srv_api_make_id(id, sizeof(id), o->kind == SRV_API_MESSAGES ? "toolu_" : "call_");
        json_t *call = json_pack("{s:s, s:s, s:{s:o, s:o}}", "id", id, "type", "function", "function", "name",
                                 srv_json_str(ev->name, strlen(ev->name)), "arguments", srv_json_str(ev->arguments, strlen(ev->arguments)));
        if (call && o->stream) json_object_set_new(call, "index", json_integer((json_int_t)ev->index));
        if (call) json_array_append_new(o->calls, call);
        o->n_calls++;
    }
}

static json_t *new_lp(const struct srv_out *o)
{
    if (!o->logprobs) return NULL;
    if (o->kind == SRV_API_CHAT) return json_array();
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

struct srv_out *srv_out_new(const struct srv_gen *g, const struct srv_api_ctx *c)
{
    struct srv_out *o = calloc(1, sizeof(*o));
    if (!o) return NULL;
    o->kind          = g->kind;
    o->stream        = g->stream;
    o->include_usage = g->include_usage;
    o->logprobs      = g->logprobs;
    o->top_logprobs  = g->top_logprobs;
    o->ids_as_text   = g->ids_as_text || !c->tok;
    o->token_ids     = g->token_ids;
    o->parse_chat    = g->parse_chat && c->tok;
    o->keep_special  = g->keep_special;
    o->think_open    = o->parse_chat && g->mode == DSV4_CHAT_MODE_THINKING;
    o->n_prompt      = g->n_prompt;
    o->created       = g->created;
    o->model         = c->model_name;
    o->tok           = c->tok;
    memcpy(o->id, g->id, sizeof(o->id));
    o->n_stop = g->n_stop;
    for (int i = 0; i < g->n_stop; i++) {
        memcpy(o->stop[i], g->stop[i], sizeof(o->stop[i]));
        size_t l = strlen(g->stop[i]);
        if (l - 1 > o->hold) o->hold = l - 1;
    }
    o->calls = json_array();
    o->lp    = new_lp(o);
    o->ids   = o->token_ids ? json_array() : NULL;
    if (o->tok) {
        o->eos  = dsv4_tokenizer_eos(o->tok);
        if (dsv4_tokenizer_token_id(o->tok, "</think>", &o->think_end, NULL)) o->think_end = -1;
        if (dsv4_tokenizer_token_id(o->tok, "｜DSML｜", &o->dsml, NULL)) o->dsml = -1;
        o->tcap = 3 * (dsv4_tokenizer_max_token_bytes(o->tok) + 3);
        o->tbuf = malloc(o->tcap);
        dsv4_tokenizer_stream_init(&o->ts);
    }
    struct dsv4_err err;
    if (!o->calls || (o->logprobs && !o->lp) || (o->token_ids && !o->ids) || (o->tok && !o->tbuf) ||
        (o->parse_chat && dsv4_chat_stream_init(&o->cs, g->mode, on_chat_event, o, &err))) {
        srv_out_free(o);
        return NULL;
    }
    if (o->parse_chat && g->forced) emit(o, g->forced, strlen(g->forced)); /* the forced call's opening */
    if (o->parse_chat && c->turns && (o->prompt_ids = malloc(sizeof(int32_t) * (size_t)(g->n_prompt + 1)))) {
        memcpy(o->prompt_ids, g->prompt, sizeof(int32_t) * (size_t)g->n_prompt);
        o->turns = c->turns;
    }
    if (o->kind == SRV_API_RESPONSES) {
        o->echo      = json_incref(g->echo);
        o->conv      = json_incref(g->conv);
        o->store     = g->store;
        o->responses = c->responses;
        struct srv_resp_out a = resp_out(o, 0);
        srv_resp_begin(&o->resp, &a, NULL); /* the stream's events are sent by srv_out_begin */
    }
    return o;
}

void srv_out_free(struct srv_out *o)
{
    if (!o) return;
    dsv4_chat_stream_free(o->cs);
    srv_resp_stream_free(&o->resp);
    free(o->prompt_ids);
    free(o->gen_ids);
    json_decref(o->echo);
    json_decref(o->conv);
    json_decref(o->calls);
    json_decref(o->lp);
    json_decref(o->ids);
    srv_buf_free(&o->pend);
    srv_buf_free(&o->content);
    srv_buf_free(&o->reasoning);
    free(o->tbuf);
    free(o);
}

int srv_out_n_tokens(const struct srv_out *o)
{
    return o->n_tok;
}

/* ------------------------------------------------------------------ the text pipeline */

/* Text past the stop strings: to the DSML parser (chat) or straight to the output. */
static void emit(struct srv_out *o, const char *s, size_t n)
{
    if (n == 0) return;
    if (o->parse_chat) {
        /* Malformed DSML (a broken call, text after the calls, a call inside the reasoning):
         * what the parser reported before stays (text, reasoning, whole calls); the rest of
         * the turn is dropped, so no markup ever reaches the text. */
        if (!o->cs_failed && dsv4_chat_stream_feed(o->cs, s, n, NULL) != DSV4_OK) o->cs_failed = true;
        return;
    }
    srv_buf_put(&o->content, s, n);
}

static void push_text(struct srv_out *o, const char *s, size_t n)
{
    if (o->stopped || n == 0) return;
    if (o->n_stop == 0) {
        emit(o, s, n);
        return;
    }
    srv_buf_put(&o->pend, s, n);
    if (o->pend.oom) return;
    size_t best = SIZE_MAX;
    for (int i = 0; i < o->n_stop; i++) {
        const char *hit = memmem(o->pend.p, o->pend.len, o->stop[i], strlen(o->stop[i]));
        if (hit && (size_t)(hit - o->pend.p) < best) best = (size_t)(hit - o->pend.p), o->stop_hit = i;
    }
    if (best != SIZE_MAX) {
        emit(o, o->pend.p, best);
        o->pend.len = 0;
        o->stopped  = true;
        return;
    }
    if (o->pend.len <= o->hold) return;
    size_t cut = o->pend.len - o->hold;
    while (cut > 0 && ((unsigned char)o->pend.p[cut] & 0xc0) == 0x80) cut--;
    emit(o, o->pend.p, cut);
    memmove(o->pend.p, o->pend.p + cut, o->pend.len - cut);
    o->pend.len -= cut;
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

static void add_logprob(struct srv_out *o, const struct srv_token *t)
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

/* ------------------------------------------------------------------ chunks */

static bool delta_empty(const struct srv_out *o)
{
    return o->content.len == 0 && o->reasoning.len == 0 && json_array_size(o->calls) == 0 &&
           (!o->lp || (o->kind == SRV_API_CHAT ? json_array_size(o->lp) == 0
                                               : json_array_size(json_object_get(o->lp, "tokens")) == 0)) &&
           (!o->ids || json_array_size(o->ids) == 0);
}

static void reset_delta(struct srv_out *o)
{
    o->content.len   = 0;
    o->reasoning.len = 0;
    json_array_clear(o->calls);
    if (o->lp) {
        json_decref(o->lp);
        o->lp = new_lp(o);
    }
    if (o->ids) json_array_clear(o->ids);
}

static json_t *jbuf(const struct srv_buf *b)
{
    return srv_json_str(b->p ? b->p : "", b->len);
}

static json_t *chunk_head(const struct srv_out *o)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", o->id, "object",
                     o->kind == SRV_API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)o->created, "model", o->model);
}

/* One SSE chunk with the pending delta (and finish_reason when given); skipped when there
 * is nothing to say. */
static struct srv_anth_out anth_out(const struct srv_out *o, const char *stop_reason, int n_cached)
{
    return (struct srv_anth_out){ .id = o->id, .model = o->model, .reasoning = &o->reasoning, .content = &o->content,
                                  .calls = o->calls, .stop_reason = stop_reason,
                                  .stop_sequence = o->stopped ? o->stop[o->stop_hit] : NULL, .n_prompt = o->n_prompt,
                                  .n_cached = n_cached, .n_out = o->n_tok };
}

void srv_out_set_choice(struct srv_out *o, int index, int n)
{
    o->choice    = index;
    o->n_choices = n;
}

static void flush_chunk(struct srv_out *o, struct srv_buf *sse, const char *finish)
{
    if (o->kind == SRV_API_MESSAGES) { /* content blocks; the end comes from srv_out_end */
        struct srv_anth_out a = anth_out(o, NULL, 0);
        srv_anth_stream_delta(&o->anth, &a, sse);
        reset_delta(o);
        return;
    }
    if (o->kind == SRV_API_RESPONSES) { /* output items, streamed or only built */
        struct srv_resp_out a = resp_out(o, 0);
        srv_resp_delta(&o->resp, &a, o->stream ? sse : NULL);
        reset_delta(o);
        return;
    }
    if (!finish && delta_empty(o)) return;
    json_t *choice = json_pack("{s:i}", "index", o->choice);
    if (o->kind == SRV_API_CHAT) {
        json_t *delta = json_object();
        if (o->reasoning.len) json_object_set_new(delta, "reasoning_content", jbuf(&o->reasoning));
        if (o->content.len) json_object_set_new(delta, "content", jbuf(&o->content));
        if (json_array_size(o->calls)) json_object_set(delta, "tool_calls", o->calls);
        json_object_set_new(choice, "delta", delta);
        json_object_set_new(choice, "logprobs",
                            o->lp && json_array_size(o->lp) ? json_pack("{s:O}", "content", o->lp) : json_null());
    } else {
        json_object_set_new(choice, "text", jbuf(&o->content));
        json_object_set_new(choice, "logprobs",
                            o->lp && json_array_size(json_object_get(o->lp, "tokens")) ? json_copy(o->lp) : json_null());
        if (o->ids) json_object_set(choice, "token_ids", o->ids);
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *c = chunk_head(o);
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    if (o->include_usage) json_object_set_new(c, "usage", json_null());
    sse_data(sse, c);
    reset_delta(o);
}

void srv_out_begin(struct srv_out *o, struct srv_buf *sse)
{
    if (o->kind == SRV_API_MESSAGES) {
        struct srv_anth_out a = anth_out(o, NULL, 0);
        srv_anth_stream_begin(&a, sse);
        return;
    }
    if (o->kind == SRV_API_RESPONSES) {
        struct srv_resp_out a = resp_out(o, 0);
        json_t             *items = o->resp.items;
        srv_resp_begin(&o->resp, &a, sse); /* a fresh item list, and the opening events */
        json_decref(items);
        return;
    }
    if (o->kind != SRV_API_CHAT) return;
    json_t *c = chunk_head(o);
    json_object_set_new(c, "choices",
                        json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", o->choice, "delta", "role", "assistant", "content",
                                  "", "logprobs", "finish_reason"));
    if (o->include_usage) json_object_set_new(c, "usage", json_null());
    sse_data(sse, c);
}

/* Whether a token's text goes into the output (see the file header on control tokens). */
static bool has_text(struct srv_out *o, int32_t id)
{
    if (o->keep_special || !dsv4_tokenizer_is_added(o->tok, id)) return true;
    if (!o->parse_chat) return false;
    if (id == o->dsml) return true;
    if (id == o->think_end && o->think_open) {
        o->think_open = false;
        return true;
    }
    return false;
}

bool srv_out_tokens(struct srv_out *o, const struct srv_token *t, int n, struct srv_buf *sse)
{
    for (int i = 0; i < n && !o->stopped; i++) {
        o->n_tok++;
        if (o->think_open) o->n_reason++;
        if (o->turns && o->n_gen == o->gen_cap) {
            int      cap = o->gen_cap ? 2 * o->gen_cap : 256;
            int32_t *p   = realloc(o->gen_ids, sizeof(int32_t) * (size_t)cap);
            if (p) o->gen_ids = p, o->gen_cap = cap;
        }
        if (o->turns && o->n_gen < o->gen_cap) o->gen_ids[o->n_gen++] = t[i].id;
        if (o->logprobs) add_logprob(o, &t[i]);
        if (o->ids) json_array_append_new(o->ids, json_integer(t[i].id));
        size_t k = 0;
        if (o->tok && has_text(o, t[i].id) &&
            dsv4_tokenizer_stream_push(o->tok, &o->ts, t[i].id, o->tbuf, o->tcap, &k, NULL) == DSV4_OK)
            push_text(o, o->tbuf, k);
        if (o->stream || o->kind == SRV_API_RESPONSES) flush_chunk(o, sse, NULL);
    }
    return o->stopped;
}

/* ------------------------------------------------------------------ the end */

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
        json_object_set_new(msg, "content", calls && o->content.len == 0 ? json_null() : jbuf(&o->content));
        if (o->reasoning.len) json_object_set_new(msg, "reasoning_content", jbuf(&o->reasoning));
        if (calls) json_object_set(msg, "tool_calls", o->calls);
        json_object_set_new(choice, "message", msg);
        json_object_set_new(choice, "logprobs", o->lp ? json_pack("{s:O}", "content", o->lp) : json_null());
    } else {
        json_object_set_new(choice, "text", jbuf(&o->content));
        json_object_set_new(choice, "logprobs", o->lp ? json_incref(o->lp) : json_null());
        if (o->ids) json_object_set(choice, "token_ids", o->ids);
    }
    json_object_set_new(choice, "finish_reason", json_string(finish));
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", o->id, "object",
                     o->kind == SRV_API_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)o->created,
                     "model", o->model, "choices", choice, "usage", usage_json(o, n_cached));
}

/* The end of an Anthropic answer: stop_reason from the OpenAI finish reason (and the stop
 * sequence that matched); an error is an "error" event mid-stream or an error body. */
static int anth_end(struct srv_out *o, const struct srv_api_error *e, const char *finish, int n_cached,
                    struct srv_buf *sse, struct srv_buf *body)
{
    const char *reason = o->stopped                    ? "stop_sequence"
                         : !strcmp(finish, "length")     ? "max_tokens"
                         : !strcmp(finish, "tool_calls") ? "tool_use"
                                                         : "end_turn";
    struct srv_anth_out a = anth_out(o, reason, n_cached);
    if (o->stream) {
        srv_anth_stream_delta(&o->anth, &a, sse);
        if (e) srv_anth_stream_error(&o->anth, e, sse);
        else srv_anth_stream_end(&o->anth, &a, sse);
        return 200;
    }
    char  *s = NULL;
    size_t n = 0;
    if (e) {
        s = srv_anth_error_json(e, &n);
    } else {
        json_t *m = srv_anth_message(&a);
        s         = m ? json_dumps(m, JSON_COMPACT) : NULL;
        json_decref(m);
        n = s ? strlen(s) : 0;
    }
    struct srv_api_error oom;
    if (!s) {
        srv_api_fail(&oom, 500, NULL, "out of memory building the response");
        s = srv_anth_error_json(&oom, &n);
        e = &oom;
    }
    if (s) srv_buf_put(body, s, n);
    free(s);
    return e ? e->status : 200;
}

/* The end of a Responses answer: the last items, the response object (the body, or the
 * response.completed / response.incomplete event); an error is an error event or body. */
static int resp_end(struct srv_out *o, const struct srv_api_error *e, const char *finish, int n_cached,
                    struct srv_buf *sse, struct srv_buf *body)
{
    struct srv_resp_out a = resp_out(o, n_cached);
    srv_resp_delta(&o->resp, &a, o->stream ? sse : NULL);
    reset_delta(o);
    if (o->stream) {
        if (e) srv_resp_error(&o->resp, e, sse);
        else srv_resp_end(&o->resp, &a, !strcmp(finish, "length"), sse);
        return 200;
    }
    char  *s = NULL;
    size_t n = 0;
    if (e) {
        s = srv_api_error_json(e, &n);
    } else {
        json_t *r = srv_resp_end(&o->resp, &a, !strcmp(finish, "length"), NULL);
        s         = r ? json_dumps(r, JSON_COMPACT) : NULL;
        json_decref(r);
        n = s ? strlen(s) : 0;
    }
    struct srv_api_error oom;
    if (!s) {
        srv_api_fail(&oom, 500, NULL, "out of memory building the response");
        s = srv_api_error_json(&oom, &n);
        e = &oom;
    }
    if (s) srv_buf_put(body, s, n);
    free(s);
    return e ? e->status : 200;
}

int srv_out_end(struct srv_out *o, enum srv_finish f, int n_cached, const char *msg, struct srv_buf *sse,
                struct srv_buf *body, enum srv_counter *counted)
{
    /* drain the pipeline: an incomplete character, the held-back text, the EOS marker */
    if (o->tok && !o->stopped) {
        char   tail[8];
        size_t k = 0;
        dsv4_tokenizer_stream_flush(&o->ts, tail, &k);
        push_text(o, tail, k);
    }
    if (!o->stopped) {
        emit(o, o->pend.p ? o->pend.p : "", o->pend.len);
        o->pend.len = 0;
    }
    struct dsv4_chat_stream_end end = { 0 };
    if (o->parse_chat && !o->cs_failed) {
        if (f == SRV_FINISH_EOS && !o->stopped) {
            const char *eos = dsv4_tokenizer_token_str(o->tok, o->eos);
            if (eos && dsv4_chat_stream_feed(o->cs, eos, strlen(eos), NULL) != DSV4_OK) o->cs_failed = true;
        }
        if (!o->cs_failed && dsv4_chat_stream_finish(o->cs, &end, NULL) != DSV4_OK) o->cs_failed = true;
    }
    bool        failed = !o->stopped && (f == SRV_FINISH_CANCELLED || f == SRV_FINISH_SLOW || f == SRV_FINISH_ERROR);
    if (!failed && o->turns) srv_turns_put(o->turns, o->tok, o->prompt_ids, o->n_prompt, o->gen_ids, o->n_gen);
    const char *finish = "stop";
    *counted           = SRV_C_FINISH_STOP;
    if (failed) {
        /* a cancelled job that still gets an answer was cut by the server's shutdown (a
         * client that went away gets none) */
        *counted = f == SRV_FINISH_SLOW ? SRV_C_FINISH_SLOW
                   : f == SRV_FINISH_ERROR ? SRV_C_FINISH_ERROR
                                           : SRV_C_FINISH_SHUTDOWN;
    } else if (!o->stopped && f == SRV_FINISH_LENGTH) {
        finish   = "length";
        *counted = SRV_C_FINISH_LENGTH;
    } else if (!o->stopped && o->n_calls > 0) {
        finish   = "tool_calls";
        *counted = SRV_C_FINISH_TOOL_CALLS;
    }
    struct srv_api_error e;
    if (failed) {
        if (f == SRV_FINISH_CANCELLED) srv_api_fail(&e, 503, NULL, "the server is shutting down; the request was cut");
        else if (f == SRV_FINISH_SLOW) srv_api_fail(&e, 500, NULL, "%s", msg && msg[0] ? msg : "the client was too slow");
        else srv_api_fail(&e, 500, NULL, "generation failed: %s", msg && msg[0] ? msg : "unknown error");
    }
    if (o->kind == SRV_API_MESSAGES) return anth_end(o, failed ? &e : NULL, finish, n_cached, sse, body);
    if (o->kind == SRV_API_RESPONSES) return resp_end(o, failed ? &e : NULL, finish, n_cached, sse, body);
    if (o->stream) {
        if (failed) {
            flush_chunk(o, sse, NULL);
            size_t n;
            char  *ej = srv_api_error_json(&e, &n);
            if (ej) srv_buf_printf(sse, "data: %s\n\n", ej);
            free(ej);
        } else {
            flush_chunk(o, sse, finish);
            if (o->include_usage && o->n_choices <= 1) {
                json_t *c = chunk_head(o);
                json_object_set_new(c, "choices", json_array());
                json_object_set_new(c, "usage", usage_json(o, n_cached));
                sse_data(sse, c);
            }
        }
        if (o->n_choices <= 1) srv_buf_puts(sse, "data: [DONE]\n\n"); /* several: srv_out_end_all ends */
        return 200;
    }
    char  *s;
    size_t n = 0;
    if (failed) {
        s = srv_api_error_json(&e, &n);
    } else {
        json_t *b = final_body(o, finish, n_cached);
        s         = b ? json_dumps(b, JSON_COMPACT) : NULL;
        json_decref(b);
        n = s ? strlen(s) : 0;
    }
    if (!s) {
        srv_api_fail(&e, 500, NULL, "out of memory building the response");
        s = srv_api_error_json(&e, &n);
        failed = true;
    }
    if (s) srv_buf_put(body, s, n);
    free(s);
    return failed ? e.status : 200;
}

/* ------------------------------------------------------------------ several choices */

int srv_out_end_all(struct srv_out **outs, struct srv_job **jobs, const enum srv_finish *fin, bool *ended, int n,
                    int n_cached, struct srv_buf *sse, struct srv_buf *body, enum srv_counter *counted)
{
    if (n == 1 && !ended[0] && fin[0] != SRV_FINISH_NONE) { /* the common case, as it always was */
        ended[0] = true;
        return srv_out_end(outs[0], fin[0], n_cached, jobs[0]->msg, sse, body, &counted[0]);
    }
    if (n == 1) {
        counted[0] = SRV_C_COUNT;
        return 200;
    }
    int            status = 200, failed = -1;
    struct srv_buf parts[SRV_MAX_N];
    memset(parts, 0, sizeof(parts));
    int n_ended = 0, completion = 0;
    for (int i = 0; i < n; i++) {
        counted[i] = SRV_C_COUNT;
        if (!ended[i] && fin[i] != SRV_FINISH_NONE) {
            int st = srv_out_end(outs[i], fin[i], n_cached, jobs[i]->msg, sse, sse ? NULL : &parts[i], &counted[i]);
            if (st != 200 && status == 200) status = st, failed = i;
            ended[i] = true;
        }
        if (ended[i]) n_ended++;
        completion += srv_out_n_tokens(outs[i]);
    }
    if (n_ended < n) return 200; /* streaming: the others end later */
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
    for (int i = 0; i < n; i++) srv_buf_free(&parts[i]);
    return status;
}
