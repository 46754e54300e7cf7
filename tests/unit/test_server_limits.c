/*
 * test_server_limits.c - one max_tokens rule in every dialect (docs/SERVER.md, "max_tokens";
 * src/server/request.c): a limit above the model's max_position_embeddings (4096 for the
 * tiny-a test model) is a 400 in the dialect's error shape; a limit the model could hold but
 * the server's context (--ctx 96, less the prompt) cannot is clipped to what the context
 * leaves, and an answer cut there ends as one that reached its limit; a small limit is kept.
 *
 * Each dialect gets the same three limits: 4097 (over), 4096 (the model's own maximum: held
 * by the model, not by this context, so clipped) and 3.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_server_limits.h"

enum { CTX = 96, OVER = 4097, MODEL_MAX = 4096, SMALL = 3 };

/* One dialect: its path, how a body with a limit reads, where its answer keeps the counts
 * and the reason. */
struct dialect {
    const char *name, *path, *limit_field;
    const char *head, *tail; /* the body: head, the limit, tail */
    bool        anthropic_errors;
    const char *cut_reason; /* the reason of an answer that reached its limit */
};

static const struct dialect DIALECTS[] = {
    { "chat", "/v1/chat/completions", "max_tokens",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me of the rivers.\"}],\"max_tokens\":",
      ",\"temperature\":0,\"ignore_eos\":true}", false, "length" },
    { "completions", "/v1/completions", "max_tokens",
      "{\"prompt\":\"In the beginning\",\"max_tokens\":", ",\"temperature\":0,\"ignore_eos\":true}", false,
      "length" },
    { "messages", "/v1/messages", "max_tokens",
      "{\"model\":\"srv-tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me of the rivers.\"}],"
      "\"max_tokens\":", ",\"temperature\":0}", true, "max_tokens" },
    { "responses", "/v1/responses", "max_output_tokens",
      "{\"input\":\"Tell me of the rivers.\",\"max_output_tokens\":", ",\"temperature\":0}", false,
      "max_output_tokens" },
};

/* The answer's prompt and generated token counts, and why it ended. */
static void counts(const struct dialect *d, json_t *r, long long *n_prompt, long long *n_out, const char **reason)
{
    json_t *u = json_object_get(r, "usage");
    if (!strcmp(d->name, "messages")) {
        *n_prompt = json_integer_value(json_object_get(u, "input_tokens")) +
                    json_integer_value(json_object_get(u, "cache_read_input_tokens"));
        *n_out    = json_integer_value(json_object_get(u, "output_tokens"));
        *reason   = json_string_value(json_object_get(r, "stop_reason"));
    } else if (!strcmp(d->name, "responses")) {
        *n_prompt = json_integer_value(json_object_get(u, "input_tokens"));
        *n_out    = json_integer_value(json_object_get(u, "output_tokens"));
        *reason   = json_string_value(json_object_get(json_object_get(r, "incomplete_details"), "reason"));
    } else {
        *n_prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
        *n_out    = json_integer_value(json_object_get(u, "completion_tokens"));
        *reason   = json_string_value(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "finish_reason"));
    }
}

static void over(struct test_ctx *t, struct tsrv *s, const struct dialect *d)
{
    char body[512];
    snprintf(body, sizeof(body), "%s%d%s", d->head, OVER, d->tail);
    json_t *r  = NULL;
    int     st = tsrv_post(s, d->path, body, NULL, &r);
    json_t *e  = json_object_get(r, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    CHECKF(st == 400, "%s: a limit of %d (above max_position_embeddings): status %d", d->name, OVER, st);
    CHECKF(msg && strstr(msg, "max_position_embeddings") && strstr(msg, d->limit_field), "%s: message '%s'", d->name,
           msg ? msg : "(none)");
    if (d->anthropic_errors) {
        CHECKF(!strcmp(test_str(json_string_value(json_object_get(r, "type"))) ?: "", "error") &&
                   !strcmp(test_str(json_string_value(json_object_get(e, "type"))) ?: "", "invalid_request_error"),
               "%s: not Anthropic's error shape", d->name);
    } else {
        CHECKF(!strcmp(test_str(json_string_value(json_object_get(e, "param"))) ?: "", d->limit_field) &&
                   !strcmp(test_str(json_string_value(json_object_get(e, "code"))) ?: "", "context_length_exceeded"),
               "%s: param %s, code %s", d->name, json_string_value(json_object_get(e, "param")) ?: "null",
               json_string_value(json_object_get(e, "code")) ?: "null");
    }
    json_decref(r);
}

/* A limit that is kept (SMALL) or clipped to the context (MODEL_MAX): the answer is at
 * most that long, and one that reached it says so. */
static void in_range(struct test_ctx *t, struct tsrv *s, const struct dialect *d, int limit)
{
    char body[512];
    snprintf(body, sizeof(body), "%s%d%s", d->head, limit, d->tail);
    json_t *r  = NULL;
    int     st = tsrv_post(s, d->path, body, NULL, &r);
    CHECKF(st == 200, "%s: a limit of %d: status %d", d->name, limit, st);
    long long   n_prompt = 0, n_out = 0;
    const char *reason   = NULL;
    counts(d, r, &n_prompt, &n_out, &reason);
    long long cap = limit < CTX - n_prompt ? limit : CTX - n_prompt;
    CHECKF(n_prompt > 0 && n_prompt < CTX, "%s: %lld prompt tokens", d->name, n_prompt);
    CHECKF(n_out >= 1 && n_out <= cap, "%s: limit %d: %lld tokens generated, at most %lld", d->name, limit, n_out, cap);
    bool cut = reason && !strcmp(reason, d->cut_reason);
    CHECKF(!cut || n_out == cap, "%s: limit %d: reason %s after %lld of %lld tokens", d->name, limit,
           reason ? reason : "(none)", n_out, cap);
    /* chat and completions ignore EOS: they reach the limit, clipped or not */
    if (strcmp(d->name, "chat") == 0 || strcmp(d->name, "completions") == 0)
        CHECKF(cut && n_out == cap, "%s: limit %d: %lld of %lld tokens, reason %s", d->name, limit, n_out, cap,
               reason ? reason : "(none)");
    json_decref(r);
}

void tlim_test_max_tokens(struct test_ctx *t, const char *model_dir)
{
    struct tsrv s;
    char        args[64];
    snprintf(args, sizeof(args), "--max-seqs 2 --ctx %d", CTX);
    if (!tsrv_start(t, &s, model_dir, args)) return;
    for (size_t i = 0; i < sizeof(DIALECTS) / sizeof(DIALECTS[0]); i++) {
        over(t, &s, &DIALECTS[i]);
        in_range(t, &s, &DIALECTS[i], MODEL_MAX);
        in_range(t, &s, &DIALECTS[i], SMALL);
    }
    tsrv_stop(&s, 15, 10);
}
