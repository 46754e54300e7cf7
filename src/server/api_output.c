/*
 * api_output.c - the output pipeline every dialect shares: generated tokens -> the streaming
 * detokenizer, stop strings and the DSML parser -> reasoning, content and whole tool calls
 * in struct srv_out (api.h), which the request's dialect (api_openai.c, api_anthropic.c,
 * api_responses.c, reached through the table of api.c) writes in its shapes: SSE events as
 * tokens arrive, or one JSON body at the end. Log-probabilities are the dialect's too.
 *
 * The pipeline per token, in order:
 *   1. count it and hand it to the dialect's logprobs (they belong to the token even if its
 *      text is held back);
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
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/api.h"

static void emit(struct srv_out *o, const char *s, size_t n);

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
        srv_api_make_id(id, sizeof(id), o->d->call_prefix);
        json_t *call = json_pack("{s:s, s:s, s:{s:o, s:o}}", "id", id, "type", "function", "function", "name",
                                 srv_json_str(ev->name, strlen(ev->name)), "arguments", srv_json_str(ev->arguments, strlen(ev->arguments)));
        if (call && o->stream) json_object_set_new(call, "index", json_integer((json_int_t)ev->index));
        if (call) json_array_append_new(o->calls, call);
        o->n_calls++;
    }
}

struct srv_out *srv_out_new(const struct srv_gen *g, const struct srv_api_ctx *c)
{
    struct srv_out *o = calloc(1, sizeof(*o));
    if (!o) return NULL;
    o->d             = srv_dialect_of(g->kind);
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
    int rc   = o->d->open ? o->d->open(o, g, c) : 0;
    if (o->tok) {
        o->eos  = dsv4_tokenizer_eos(o->tok);
        if (dsv4_tokenizer_token_id(o->tok, "</think>", &o->think_end, NULL)) o->think_end = -1;
        if (dsv4_tokenizer_token_id(o->tok, "｜DSML｜", &o->dsml, NULL)) o->dsml = -1;
        o->tcap = 3 * (dsv4_tokenizer_max_token_bytes(o->tok) + 3);
        o->tbuf = malloc(o->tcap);
        dsv4_tokenizer_stream_init(&o->ts);
    }
    struct dsv4_err err;
    if (!o->calls || rc || (o->tok && !o->tbuf) ||
        (o->parse_chat && dsv4_chat_stream_init(&o->cs, g->mode, on_chat_event, o, &err))) {
        srv_out_free(o);
        return NULL;
    }
    if (o->parse_chat && g->forced) emit(o, g->forced, strlen(g->forced)); /* the forced call's opening */
    if (o->parse_chat && c->turns && (o->prompt_ids = malloc(sizeof(int32_t) * (size_t)(g->n_prompt + 1)))) {
        memcpy(o->prompt_ids, g->prompt, sizeof(int32_t) * (size_t)g->n_prompt);
        o->turns = c->turns;
    }
    return o;
}

void srv_out_free(struct srv_out *o)
{
    if (!o) return;
    if (o->d->close) o->d->close(o);
    dsv4_chat_stream_free(o->cs);
    free(o->prompt_ids);
    free(o->gen_ids);
    json_decref(o->calls);
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

void srv_out_set_choice(struct srv_out *o, int index, int n)
{
    o->choice    = index;
    o->n_choices = n;
}

void srv_out_begin(struct srv_out *o, struct srv_buf *sse)
{
    o->d->begin(o, sse);
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
        if (o->logprobs && o->d->logprob) o->d->logprob(o, &t[i]);
        if (o->ids) json_array_append_new(o->ids, json_integer(t[i].id));
        size_t k = 0;
        if (o->tok && has_text(o, t[i].id) &&
            dsv4_tokenizer_stream_push(o->tok, &o->ts, t[i].id, o->tbuf, o->tcap, &k, NULL) == DSV4_OK)
            push_text(o, o->tbuf, k);
        if (o->stream || o->d->every_token) o->d->delta(o, sse);
    }
    return o->stopped;
}

/* ------------------------------------------------------------------ the end */

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
    return o->d->end(o, failed ? &e : NULL, finish, n_cached, sse, body);
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
    status = outs[0]->d->end_choices(outs, n, parts, status, failed, completion, n_cached, sse, body);
    for (int i = 0; i < n; i++) srv_buf_free(&parts[i]);
    return status;
}
