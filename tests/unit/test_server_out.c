/*
 * test_server_out.c - the server's weight-free parts on canned input (run in the server
 * group): generated tokens through srv_out (reasoning_content, content and tool calls, in
 * whole bodies and SSE deltas, whatever the grouping of tokens into events; stop strings
 * that span tokens and characters), the job ring's bound, JSON depth, and the Prometheus
 * validator the HTTP tests rely on.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "test_server_util.h"

static dsv4_tokenizer *test_tok(struct test_ctx *t)
{
    char dir[512], path[600];
    snprintf(dir, sizeof(dir), "%s/canned-tok", t->tmpdir);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
    if (system(cmd) != 0) return NULL;
    struct dsv4_err err;
    CHECKF(tsrv_write_tokenizer(dir, 2048, &err) == DSV4_OK, "%s", err.msg);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    dsv4_tokenizer *tok = NULL;
    CHECKF(dsv4_tokenizer_load(&tok, path, &err) == DSV4_OK, "%s", err.msg);
    return tok;
}

static int32_t *encode(const dsv4_tokenizer *tok, const char *s, int *n)
{
    size_t   len = strlen(s), k = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (3 * len + 1));
    if (ids && dsv4_tokenizer_encode(tok, s, len, 0, ids, 3 * len + 1, &k, NULL)) k = 0;
    *n = (int)k;
    return ids;
}

static void check_calls(struct test_ctx *t, json_t *calls, bool stream)
{
    CHECKF(json_array_size(calls) == 2, "%zu tool calls", json_array_size(calls));
    static const char *const names[] = { "get_weather", "get_time" };
    static const char *const args[]  = { "{\"city\": \"Paris\", \"days\": 3}", "{\"tz\": \"CET\"}" };
    for (size_t i = 0; i < 2 && i < json_array_size(calls); i++) {
        json_t     *c  = json_array_get(calls, i);
        json_t     *fn = json_object_get(c, "function");
        const char *id = json_string_value(json_object_get(c, "id"));
        CHECK(id && !strncmp(id, "call_", 5));
        CHECK(!strcmp(test_str(json_string_value(json_object_get(c, "type"))), "function"));
        CHECK(!strcmp(test_str(json_string_value(json_object_get(fn, "name"))), names[i]));
        json_t *got = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        json_t *want = json_loads(args[i], 0, NULL);
        CHECKF(got && json_equal(got, want), "call %zu arguments: %s", i, json_string_value(json_object_get(fn, "arguments")));
        json_decref(got);
        json_decref(want);
        if (stream) CHECK(json_integer_value(json_object_get(c, "index")) == (json_int_t)i);
    }
}

void tsrv_test_out_tool_calls(struct test_ctx *t)
{
    dsv4_tokenizer *tok = test_tok(t);
    if (!tok) return;
    char *turn = tsrv_canned_turn();
    CHECK(turn && strstr(turn, "｜DSML｜invoke"));
    int      n;
    int32_t *ids = encode(tok, turn ? turn : "", &n);
    CHECK(n > 20);

    char   *whole = tsrv_canned_output(tok, ids, n, false, 1);
    json_t *r     = whole ? json_loads(whole, 0, NULL) : NULL;
    json_t *ch    = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg   = json_object_get(ch, "message");
    CHECK(!strcmp(test_str(json_string_value(json_object_get(msg, "reasoning_content"))), "The user wants two things."));
    CHECK(!strcmp(test_str(json_string_value(json_object_get(msg, "content"))), "Let me check."));
    check_calls(t, json_object_get(msg, "tool_calls"), false);
    CHECK(!strcmp(test_str(json_string_value(json_object_get(ch, "finish_reason"))), "tool_calls"));
    json_t *u = json_object_get(r, "usage");
    CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == n);
    CHECK(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) == 4);
    json_decref(r);
    free(whole);

    for (int per = 1; per <= 7; per += 3) { /* one token per event, or several */
        char *sse = tsrv_canned_output(tok, ids, n, true, per);
        CHECK(sse != NULL);
        json_t *calls = json_array();
        char   *reasoning = strdup(""), *content = strdup(""), *finish = NULL;
        bool    done = false, role = false;
        int     n_chunks = 0;
        for (char *line = sse ? strtok(sse, "\n") : NULL; line; line = strtok(NULL, "\n")) {
            CHECKF(!strncmp(line, "data: ", 6), "SSE line: %s", line);
            if (!strcmp(line + 6, "[DONE]")) {
                done = true;
                continue;
            }
            json_t *c = json_loads(line + 6, 0, NULL);
            CHECKF(c != NULL, "chunk is not JSON: %s", line);
            CHECK(!strcmp(test_str(json_string_value(json_object_get(c, "object"))), "chat.completion.chunk"));
            json_t *c0 = json_array_get(json_object_get(c, "choices"), 0);
            json_t *d  = json_object_get(c0, "delta");
            if (n_chunks++ == 0) role = !strcmp(test_str(json_string_value(json_object_get(d, "role"))), "assistant");
            const char *s;
            if ((s = json_string_value(json_object_get(d, "reasoning_content")))) {
                reasoning = realloc(reasoning, strlen(reasoning) + strlen(s) + 1);
                strcat(reasoning, s);
            }
            if ((s = json_string_value(json_object_get(d, "content")))) {
                content = realloc(content, strlen(content) + strlen(s) + 1);
                strcat(content, s);
            }
            if (json_object_get(d, "tool_calls")) json_array_extend(calls, json_object_get(d, "tool_calls"));
            if ((s = json_string_value(json_object_get(c0, "finish_reason")))) finish = strdup(s);
            json_decref(c);
        }
        CHECK(done && role);
        CHECKF(!strcmp(reasoning, "The user wants two things."), "streamed reasoning '%s'", reasoning);
        CHECKF(!strcmp(content, "Let me check."), "streamed content '%s'", content);
        check_calls(t, calls, true);
        CHECK(finish && !strcmp(finish, "tool_calls"));
        json_decref(calls);
        free(reasoning);
        free(content);
        free(finish);
        free(sse);
    }
    free(ids);
    free(turn);
    dsv4_tokenizer_free(tok);
}

/* No DSML markup reaches the text, whatever the model writes: the canned turn cut after
 * every token (a call cut by max_tokens), with a broken call, and with text after the calls,
 * through every chat API, whole and streamed. */
void tsrv_test_out_no_markup(struct test_ctx *t)
{
    dsv4_tokenizer *tok = test_tok(t);
    char           *turn = tok ? tsrv_canned_turn() : NULL;
    if (!turn) {
        dsv4_tokenizer_free(tok);
        return;
    }
    char *broken = strdup(turn), *after = malloc(strlen(turn) + 32);
    char *at = strstr(broken, "name=\"get_time\"");
    CHECK(at != NULL);
    if (at) memcpy(at, "nmae", 4); /* the second call cannot be read */
    sprintf(after, "%s and more text", turn);
    const char *variants[3] = { turn, broken, after };
    static const int kinds[3] = { SRV_API_CHAT, SRV_API_MESSAGES, SRV_API_RESPONSES };
    int checked = 0;
    for (int v = 0; v < 3; v++) {
        int      n;
        int32_t *ids = encode(tok, variants[v], &n);
        for (int cut = v == 0 ? 1 : n; cut <= n; cut++)
            for (int k = 0; k < 3; k++)
                for (int stream = 0; stream < 2; stream++) {
                    char *out = tsrv_canned_run(tok, ids, cut, kinds[k], stream, 1, NULL,
                                                cut < n ? SRV_FINISH_LENGTH : SRV_FINISH_EOS);
                    bool  ok  = out && !strstr(out, "DSML") && !strstr(out, "invoke") && !strstr(out, "parameter") &&
                              !strstr(out, "more text");
                    CHECKF(ok, "variant %d cut at %d of %d tokens, api %d, stream %d: %s", v, cut, n, kinds[k], stream,
                           out ? out : "(null)");
                    checked++;
                    free(out);
                }
        free(ids);
    }
    CHECK(checked > 100);
    free(broken);
    free(after);
    free(turn);
    dsv4_tokenizer_free(tok);
}

/* A completion of text through srv_out with stop strings; the output text and finish. */
static void run_stop(struct test_ctx *t, const dsv4_tokenizer *tok, const char *text, const char *const *stops,
                     int n_stop, bool stream, char **out, char **finish)
{
    struct srv_gen g;
    memset(&g, 0, sizeof(g));
    g.kind     = SRV_API_COMPLETION;
    g.n_prompt = 3;
    g.stream   = stream;
    g.n_stop   = n_stop;
    for (int i = 0; i < n_stop; i++) snprintf(g.stop[i], sizeof(g.stop[i]), "%s", stops[i]);
    struct srv_api_ctx c = { .model_name = "m", .tok = tok, .vocab = 2048, .ctx = 4096 };
    struct srv_out    *o = srv_out_new(&g, &c);
    CHECK(o != NULL);
    if (!o) return;
    int              n;
    int32_t         *ids = encode(tok, text, &n);
    struct srv_buf   sse = { 0 }, body = { 0 };
    bool             stopped = false;
    for (int i = 0; i < n && !stopped; i++) {
        struct srv_token ev = { .id = ids[i] };
        stopped = srv_out_tokens(o, &ev, 1, &sse);
    }
    enum srv_counter counted;
    srv_out_end(o, stopped ? SRV_FINISH_CANCELLED : SRV_FINISH_LENGTH, 0, NULL, &sse, &body, &counted);
    *out    = strdup("");
    *finish = NULL;
    if (stream) {
        for (char *line = strtok(sse.p, "\n"); line; line = strtok(NULL, "\n")) {
            if (strncmp(line, "data: {", 7)) continue;
            json_t     *j  = json_loads(line + 6, 0, NULL);
            json_t     *c0 = json_array_get(json_object_get(j, "choices"), 0);
            const char *s  = json_string_value(json_object_get(c0, "text"));
            if (s) {
                *out = realloc(*out, strlen(*out) + strlen(s) + 1);
                strcat(*out, s);
            }
            if (json_string_value(json_object_get(c0, "finish_reason")))
                *finish = strdup(test_str(json_string_value(json_object_get(c0, "finish_reason"))));
            json_decref(j);
        }
    } else {
        json_t *j  = json_loads(body.p, 0, NULL);
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        free(*out);
        *out    = strdup(test_str(json_string_value(json_object_get(c0, "text"))));
        *finish = strdup(test_str(json_string_value(json_object_get(c0, "finish_reason"))));
        json_decref(j);
    }
    free(ids);
    srv_buf_free(&sse);
    srv_buf_free(&body);
    srv_out_free(o);
}

void tsrv_test_out_stop_strings(struct test_ctx *t)
{
    dsv4_tokenizer *tok = test_tok(t);
    if (!tok) return;
    static const struct {
        const char *text;
        const char *stops[2];
        int         n_stop;
        const char *want, *finish;
    } cases[] = {
        { "the quick brown fox jumps over the lazy dog", { "over the" }, 1, "the quick brown fox jumps ", "stop" },
        { "the quick brown fox jumps over the lazy dog", { "zebra", "own f" }, 2, "the quick br", "stop" },
        { "the quick brown fox", { "fox jumps" }, 1, "the quick brown fox", "length" },
        { "caf\xc3\xa9 au lait, caf\xc3\xa9 noir", { "\xc3\xa9 n" }, 1, "caf\xc3\xa9 au lait, caf", "stop" },
        { "na\xc3\xafve \xe2\x82\xac price", { "price" }, 1, "na\xc3\xafve \xe2\x82\xac ", "stop" },
        { "abc", { "abc" }, 1, "", "stop" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int stream = 0; stream < 2; stream++) {
            char *out, *finish;
            run_stop(t, tok, cases[i].text, cases[i].stops, cases[i].n_stop, stream, &out, &finish);
            CHECKF(out && !strcmp(out, cases[i].want), "case %zu (%s): '%s', want '%s'", i, stream ? "stream" : "whole",
                   out ? out : "", cases[i].want);
            CHECKF(finish && !strcmp(finish, cases[i].finish), "case %zu: finish %s", i, finish ? finish : "(none)");
            free(out);
            free(finish);
        }
    }
    dsv4_tokenizer_free(tok);
}

void tsrv_test_job_ring(struct test_ctx *t)
{
    int32_t         p[2] = { 1, 2 };
    struct srv_job *j    = srv_job_new(p, 2, 100, 4);
    CHECK(j && j->ring_cap == 4);
    if (!j) return;
    struct srv_token tk = { .id = 7 }, out[8];
    for (int i = 0; i < 4; i++) CHECK(srv_job_push(j, &tk));
    CHECK(!srv_job_push(j, &tk)); /* full: the worker cuts the stream */
    enum srv_finish f;
    int             cached;
    CHECK(srv_job_take(j, out, 3, 0, &f, &cached) == 3 && f == SRV_FINISH_NONE);
    tk.id = 9;
    CHECK(srv_job_push(j, &tk));
    srv_job_finish(j, SRV_FINISH_LENGTH, NULL);
    CHECK(srv_job_take(j, out, 8, 0.01, &f, &cached) == 2 && out[1].id == 9 && f == SRV_FINISH_LENGTH);
    srv_job_unref(j);
    /* a short job's ring is no longer than its max_tokens */
    j = srv_job_new(p, 2, 3, 4096);
    CHECK(j && j->ring_cap == 3);
    srv_job_unref(j);

    CHECK(srv_json_depth("{\"a\":[1,{\"b\":\"[[[[\"}]}", 21) == 3);
    CHECK(srv_json_depth("\"\\\"[[\"", 6) == 0);
}

void tsrv_test_prom_validator(struct test_ctx *t)
{
    const char *good = "# HELP a_total A counter.\n# TYPE a_total counter\na_total{x=\"1\"} 3\na_total{x=\"q\\\"\\\\\\n\"} 0\n"
                       "# TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1.25\nh_count 2\n"
                       "# TYPE g gauge\ng NaN\ng{y=\"z\"} -1.5e-3 1700000000\n";
    char why[256];
    CHECKF(tsrv_prom_validate(good, why, sizeof(why)), "%s", why);
    CHECK(tsrv_metric(good, "h_count") == 2);
    CHECK(isnan(tsrv_metric(good, "nothing")));
    static const char *const bad[] = {
        "a 1\n",                                                          /* no TYPE */
        "# TYPE a counter\na -1\n",                                       /* negative counter */
        "# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n",                   /* duplicate series */
        "# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n", /* not cumulative */
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n",     /* count != +Inf */
        "# TYPE a gauge\na{x=\"\\t\"} 1\n",                               /* bad escape */
        "# TYPE a gauge\na 1",                                            /* no final newline */
        "# TYPE a gauge\na one\n",                                        /* bad value */
        "# TYPE a nonsense\na 1\n",                                       /* bad type */
        "# TYPE 1a gauge\n",                                              /* bad name */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECKF(!tsrv_prom_validate(bad[i], why, sizeof(why)), "bad case %zu passed", i);
}
