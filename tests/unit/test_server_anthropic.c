/*
 * test_server_anthropic.c - the Anthropic Messages API of `dsv4 serve` (run in the server
 * group):
 *   - canned turns (reasoning, text, two DSML tool calls) through srv_out: the whole message
 *     and the SSE event sequence, checked against the API's grammar (message_start, ping,
 *     content_block_start/delta/stop with increasing indices, message_delta, message_stop)
 *     and replayed into the same message at 1, 3 and 7 tokens per event; stop sequences;
 *   - against the live server: /v1/messages gives the text /v1/chat/completions gives for
 *     the same conversation (one conversation model under both APIs), streamed and whole;
 *     count_tokens equals the chat prompt's tokens, also for a tool round trip written in
 *     each API's shapes; a follow-up turn reads the prefix cache; bad inputs get 4xx in
 *     Anthropic's error shape;
 *   - the official Anthropic Node SDK (tests/server/anthropic_client.mjs).
 */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "test_server_util.h"
#include "test_server_anthropic.h"

/* ------------------------------------------------------------------ the event grammar */

static void append(char **s, const char *x)
{
    size_t a = strlen(*s), b = strlen(x);
    char  *p = realloc(*s, a + b + 1);
    if (!p) return;
    memcpy(p + a, x, b + 1);
    *s = p;
}

/* Replays Anthropic stream events (parsed data objects, in order) into the message they
 * describe; NULL with why when the sequence breaks the API's grammar. */
json_t *tanth_replay(json_t *events, char *why, size_t cap)
{
    size_t n = json_array_size(events);
    json_t *first = json_array_get(events, 0);
#define BAD(...) do { snprintf(why, cap, __VA_ARGS__); json_decref(msg); free(buf); return NULL; } while (0)
    json_t *msg = NULL;
    char   *buf = NULL;
    if (!first || strcmp(test_str(json_string_value(json_object_get(first, "type"))), "message_start") != 0)
        BAD("the first event is not message_start");
    msg = json_deep_copy(json_object_get(first, "message"));
    if (!json_is_array(json_object_get(msg, "content")) || json_array_size(json_object_get(msg, "content")))
        BAD("message_start has content");
    int  open = -1, blocks = 0;
    bool delta_seen = false, stopped = false;
    for (size_t i = 1; i < n; i++) {
        json_t     *ev   = json_array_get(events, i);
        const char *type = json_string_value(json_object_get(ev, "type"));
        json_t     *content = json_object_get(msg, "content");
        if (!type) BAD("event %zu has no type", i);
        if (stopped) BAD("event %s after message_stop", type);
        if (!strcmp(type, "ping")) continue;
        int index = (int)json_integer_value(json_object_get(ev, "index"));
        if (!strcmp(type, "content_block_start")) {
            if (open >= 0 || delta_seen) BAD("content_block_start %d while block %d is open or after message_delta", index, open);
            if (index != blocks) BAD("content_block_start index %d, want %d", index, blocks);
            json_array_append_new(content, json_deep_copy(json_object_get(ev, "content_block")));
            open = blocks++;
            free(buf);
            buf = strdup("");
        } else if (!strcmp(type, "content_block_delta")) {
            if (open != index) BAD("delta for block %d while %d is open", index, open);
            json_t     *b  = json_array_get(content, (size_t)index);
            json_t     *d  = json_object_get(ev, "delta");
            const char *bt = json_string_value(json_object_get(b, "type"));
            const char *dt = json_string_value(json_object_get(d, "type"));
            const char *key = !strcmp(dt, "text_delta") ? "text" : !strcmp(dt, "thinking_delta") ? "thinking"
                            : !strcmp(dt, "input_json_delta") ? "partial_json" : !strcmp(dt, "signature_delta")
                            ? "signature" : NULL;
            const char *want = !strcmp(dt, "text_delta") ? "text" : !strcmp(dt, "input_json_delta") ? "tool_use"
                                                                                                    : "thinking";
            if (!key || strcmp(bt, want) != 0) BAD("a %s in a %s block", dt, bt);
            const char *v = json_string_value(json_object_get(d, key));
            if (!v) BAD("%s without %s", dt, key);
            if (!strcmp(key, "partial_json")) append(&buf, v);
            else if (!strcmp(key, "signature")) json_object_set_new(b, "signature", json_string(v));
            else {
                char *s = strdup(test_str(json_string_value(json_object_get(b, key))));
                append(&s, v);
                json_object_set_new(b, key, json_string(s));
                free(s);
            }
        } else if (!strcmp(type, "content_block_stop")) {
            if (open != index) BAD("content_block_stop %d while %d is open", index, open);
            json_t *b = json_array_get(content, (size_t)index);
            if (!strcmp(test_str(json_string_value(json_object_get(b, "type"))), "tool_use")) {
                json_t *in = json_loads(buf, 0, NULL);
                if (!json_is_object(in)) BAD("tool_use input '%s' is not a JSON object", buf);
                json_object_set_new(b, "input", in);
            }
            open = -1;
        } else if (!strcmp(type, "message_delta")) {
            if (open >= 0 || delta_seen) BAD("message_delta with block %d open, or twice", open);
            delta_seen = true;
            json_object_update(msg, json_object_get(ev, "delta"));
            json_object_update(json_object_get(msg, "usage"), json_object_get(ev, "usage"));
        } else if (!strcmp(type, "message_stop")) {
            if (!delta_seen) BAD("message_stop before message_delta");
            stopped = true;
        } else {
            BAD("unknown event %s", type);
        }
    }
    if (!stopped) BAD("no message_stop");
    free(buf);
#undef BAD
    return msg;
}

/* Canned SSE text -> its data objects, checking that each event name equals data.type. */
static json_t *sse_events(struct test_ctx *t, char *sse)
{
    json_t     *events = json_array();
    const char *name   = NULL;
    for (char *line = strtok(sse, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "event: ", 7)) {
            name = line + 7;
            continue;
        }
        CHECKF(!strncmp(line, "data: ", 6), "SSE line: %s", line);
        json_t *d = json_loads(line + 6, 0, NULL);
        CHECKF(d && name && !strcmp(name, json_string_value(json_object_get(d, "type"))), "event %s, data %s",
               name ? name : "(none)", line);
        if (d) json_array_append_new(events, d);
        name = NULL;
    }
    return events;
}

/* The message without its id (the replay and the whole body have different ones). */
static void drop_id(json_t *m)
{
    json_object_del(m, "id");
}

static void check_canned_message(struct test_ctx *t, json_t *m)
{
    json_t *c = json_object_get(m, "content");
    CHECKF(json_array_size(c) == 4, "%zu content blocks", json_array_size(c));
    json_t *b0 = json_array_get(c, 0), *b1 = json_array_get(c, 1), *b2 = json_array_get(c, 2), *b3 = json_array_get(c, 3);
    CHECK(!strcmp(test_str(json_string_value(json_object_get(b0, "type"))), "thinking"));
    CHECK(!strcmp(test_str(json_string_value(json_object_get(b0, "thinking"))), "The user wants two things."));
    CHECK(!strcmp(test_str(json_string_value(json_object_get(b1, "type"))), "text"));
    CHECK(!strcmp(test_str(json_string_value(json_object_get(b1, "text"))), "Let me check."));
    json_t *want2 = json_pack("{s:s, s:i}", "city", "Paris", "days", 3), *want3 = json_pack("{s:s}", "tz", "CET");
    CHECK(!strcmp(test_str(json_string_value(json_object_get(b2, "type"))), "tool_use"));
    CHECK(!strcmp(test_str(json_string_value(json_object_get(b2, "name"))), "get_weather"));
    CHECK(json_equal(json_object_get(b2, "input"), want2));
    CHECK(!strcmp(test_str(json_string_value(json_object_get(b3, "name"))), "get_time"));
    CHECK(json_equal(json_object_get(b3, "input"), want3));
    const char *id2 = json_string_value(json_object_get(b2, "id")), *id3 = json_string_value(json_object_get(b3, "id"));
    CHECK(id2 && id3 && !strncmp(id2, "toolu_", 6) && strcmp(id2, id3) != 0);
    json_decref(want2);
    json_decref(want3);
    CHECK(!strcmp(test_str(json_string_value(json_object_get(m, "stop_reason"))), "tool_use"));
    CHECK(json_is_null(json_object_get(m, "stop_sequence")));
    json_t *u = json_object_get(m, "usage");
    CHECKF(json_integer_value(json_object_get(u, "input_tokens")) == 6 &&
           json_integer_value(json_object_get(u, "cache_read_input_tokens")) == 4,
           "usage: 10 prompt tokens, 4 cached -> input 6 + cache read 4");
}

void tanth_test_out_messages(struct test_ctx *t)
{
    char dir[512], path[600];
    snprintf(dir, sizeof(dir), "%s/canned-tok", t->tmpdir);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
    struct dsv4_err err;
    CHECK(system(cmd) == 0);
    CHECKF(tsrv_write_tokenizer(dir, 2048, &err) == DSV4_OK, "%s", err.msg);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    dsv4_tokenizer *tok = NULL;
    CHECKF(dsv4_tokenizer_load(&tok, path, &err) == DSV4_OK, "%s", err.msg);
    char *turn = tsrv_canned_turn();
    if (!tok || !turn) {
        free(turn);
        dsv4_tokenizer_free(tok);
        return;
    }
    size_t   len = strlen(turn), n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (3 * len + 1));
    CHECK(ids && dsv4_tokenizer_encode(tok, turn, len, 0, ids, 3 * len + 1, &n, NULL) == DSV4_OK);

    char   *whole = tsrv_canned_output_kind(tok, ids, (int)n, SRV_API_MESSAGES, false, 1);
    json_t *m     = whole ? json_loads(whole, 0, NULL) : NULL;
    CHECKF(m && !strcmp(test_str(json_string_value(json_object_get(m, "type"))), "message"), "whole: %s", whole ? whole : "");
    CHECK(!strncmp(test_str(json_string_value(json_object_get(m, "id"))), "msg_", 4));
    check_canned_message(t, m);
    for (int per = 1; per <= 7; per += 3) {
        char   *sse    = tsrv_canned_output_kind(tok, ids, (int)n, SRV_API_MESSAGES, true, per);
        json_t *events = sse ? sse_events(t, sse) : NULL;
        char    why[256] = "";
        json_t *r        = events ? tanth_replay(events, why, sizeof(why)) : NULL;
        CHECKF(r, "%d tokens an event: %s", per, why);
        if (r) {
            check_canned_message(t, r);
            /* the stream's message equals the whole body, blocks, ids of calls aside */
            json_t *a = json_deep_copy(m), *b = json_deep_copy(r);
            drop_id(a);
            drop_id(b);
            size_t  i;
            json_t *blk;
            json_array_foreach(json_object_get(a, "content"), i, blk) json_object_del(blk, "id");
            json_array_foreach(json_object_get(b, "content"), i, blk) json_object_del(blk, "id");
            char *sa = json_dumps(a, JSON_SORT_KEYS), *sb = json_dumps(b, JSON_SORT_KEYS);
            CHECKF(json_equal(a, b), "stream %s\nwhole  %s", sb, sa);
            free(sa);
            free(sb);
            json_decref(a);
            json_decref(b);
        }
        json_decref(r);
        json_decref(events);
        free(sse);
    }
    json_decref(m);
    free(whole);
    free(ids);
    free(turn);
    dsv4_tokenizer_free(tok);
}

/* A forced tool choice: srv_out is given the call's opening (as request_chat.c appends it
 * to the prompt) and only the tokens the model writes after it; the calls come out whole,
 * and no DSML reaches the text, in both APIs. */
void tanth_test_out_forced(struct test_ctx *t)
{
    char dir[512], path[600];
    snprintf(dir, sizeof(dir), "%s/canned-tok", t->tmpdir);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    struct dsv4_err err;
    dsv4_tokenizer *tok = NULL;
    if (dsv4_tokenizer_load(&tok, path, &err)) { /* written by out_messages, or here */
        char cmd[700];
        snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
        CHECK(system(cmd) == 0);
        CHECKF(tsrv_write_tokenizer(dir, 2048, &err) == DSV4_OK, "%s", err.msg);
        CHECKF(dsv4_tokenizer_load(&tok, path, &err) == DSV4_OK, "%s", err.msg);
    }
    char       *turn = tsrv_canned_turn();
    const char *open = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"";
    const char *at   = turn ? strstr(turn, open) : NULL;
    CHECK(at != NULL);
    if (!tok || !at) {
        free(turn);
        dsv4_tokenizer_free(tok);
        return;
    }
    at += strlen(open);
    size_t   len = strlen(at), n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (3 * len + 1));
    CHECK(ids && dsv4_tokenizer_encode(tok, at, len, 0, ids, 3 * len + 1, &n, NULL) == DSV4_OK);
    for (int kind = SRV_API_CHAT; kind <= SRV_API_MESSAGES; kind += SRV_API_MESSAGES - SRV_API_CHAT) {
        for (int stream = 0; stream < 2; stream++) {
            char *out = tsrv_canned_output_forced(tok, ids, (int)n, kind, stream, open);
            CHECKF(out && !strstr(out, "DSML") && strstr(out, "get_weather") && strstr(out, "get_time") &&
                       strstr(out, kind == SRV_API_CHAT ? "tool_calls" : "tool_use"),
                   "forced call, kind %d stream %d: %s", kind, stream, out ? out : "");
            free(out);
        }
    }
    free(ids);
    free(turn);
    dsv4_tokenizer_free(tok);
}

/* ------------------------------------------------------------------ the live server */

static const char *text_of(json_t *msg)
{
    size_t  i;
    json_t *b;
    json_array_foreach(json_object_get(msg, "content"), i, b)
        if (!strcmp(test_str(json_string_value(json_object_get(b, "type"))), "text")) return json_string_value(json_object_get(b, "text"));
    return NULL;
}

static long long usage_of(json_t *r, const char *k)
{
    return json_integer_value(json_object_get(json_object_get(r, "usage"), k));
}

/* The same conversation through both APIs gives the same greedy text and token counts. */
static void same_as_chat(struct test_ctx *t, struct tsrv *s)
{
    /* a system prompt longer than a KV page, so the second request can hit the prefix cache */
    char sys[4096];
    size_t k = 0;
    for (int i = 0; i < 60; i++) k += (size_t)snprintf(sys + k, sizeof(sys) - k, "Rule %d: be terse. ", i);
    char anth[8192], chat[8192];
    snprintf(anth, sizeof(anth),
             "{\"model\":\"srv-tiny\",\"max_tokens\":12,\"temperature\":0,\"system\":\"%s\","
             "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"tell me\"},"
             "{\"type\":\"text\",\"text\":\"about rivers\"}]}]}", sys);
    snprintf(chat, sizeof(chat),
             "{\"model\":\"srv-tiny\",\"max_tokens\":12,\"temperature\":0,\"messages\":["
             "{\"role\":\"system\",\"content\":\"%s\"},"
             "{\"role\":\"user\",\"content\":\"tell me\\n\\nabout rivers\"}]}", sys);
    json_t *a = NULL, *c = NULL;
    CHECK(tsrv_post(s, "/v1/messages", anth, NULL, &a) == 200);
    CHECK(tsrv_post(s, "/v1/chat/completions", chat, NULL, &c) == 200);
    json_t     *msg = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message");
    const char *ta = text_of(a), *tc = json_string_value(json_object_get(msg, "content"));
    CHECKF(ta && tc && !strcmp(ta, tc), "messages '%s' vs chat '%s'", ta ? ta : "", tc ? tc : "");
    long long prompt = json_integer_value(json_object_get(json_object_get(c, "usage"), "prompt_tokens"));
    CHECKF(usage_of(a, "input_tokens") + usage_of(a, "cache_read_input_tokens") == prompt,
           "input %lld + cache read %lld vs prompt %lld", usage_of(a, "input_tokens"),
           usage_of(a, "cache_read_input_tokens"), prompt);
    CHECK(usage_of(a, "output_tokens") == json_integer_value(json_object_get(json_object_get(c, "usage"),
                                                                           "completion_tokens")));
    const char *fin = json_string_value(json_object_get(json_array_get(json_object_get(c, "choices"), 0), "finish_reason"));
    const char *sr  = json_string_value(json_object_get(a, "stop_reason"));
    CHECKF(sr && fin && !strcmp(sr, !strcmp(fin, "length") ? "max_tokens" : "end_turn"), "stop_reason %s, finish %s",
           sr ? sr : "", fin ? fin : "");
    /* the second request found the first one's prompt in the prefix cache */
    CHECKF(prompt > 256, "prompt of %lld tokens: shorter than a page", prompt);
    CHECKF(usage_of(a, "cache_read_input_tokens") > 0 ||
               json_integer_value(json_object_get(json_object_get(json_object_get(c, "usage"), "prompt_tokens_details"),
                                                  "cached_tokens")) > 0,
           "no prefix-cache hit between the two APIs");

    /* streamed: the same message */
    char *body = strdup(anth);
    body[strlen(body) - 1] = '\0';
    char sbody[8300];
    snprintf(sbody, sizeof(sbody), "%s,\"stream\":true}", body);
    free(body);
    struct tsrv_stream st;
    CHECK(tsrv_stream(s, "/v1/messages", sbody, NULL, &st) == 200);
    char    why[256] = "";
    json_t *r        = tanth_replay(st.chunks, why, sizeof(why));
    CHECKF(r, "stream: %s", why);
    const char *tr = r ? text_of(r) : NULL;
    CHECKF(tr && ta && !strcmp(tr, ta), "streamed '%s' vs whole '%s'", tr ? tr : "", ta ? ta : "");
    CHECK(r && !strcmp(test_str(json_string_value(json_object_get(r, "stop_reason"))), json_string_value(json_object_get(a, "stop_reason"))));
    CHECK(r && usage_of(r, "output_tokens") == usage_of(a, "output_tokens"));
    json_decref(r);
    tsrv_stream_free(&st);
    json_decref(a);
    json_decref(c);
}

/* count_tokens equals the chat prompt's tokens, for a tool round trip in each API's shapes. */
static void count_matches(struct test_ctx *t, struct tsrv *s)
{
    const char *anth =
        "{\"model\":\"srv-tiny\",\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather for a city\","
        "\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}],"
        "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"Call the tool.\",\"signature\":\"\"},"
        "{\"type\":\"text\",\"text\":\"Checking.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"sunny\"},"
        "{\"type\":\"text\",\"text\":\"and tomorrow?\"}]}]}";
    const char *chat =
        "{\"model\":\"srv-tiny\",\"max_tokens\":1,\"reasoning_effort\":\"medium\",\"tools\":[{\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"description\":\"Weather for a city\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"},"
        "{\"role\":\"assistant\",\"reasoning_content\":\"Call the tool.\",\"content\":\"Checking.\",\"tool_calls\":[{"
        "\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"sunny\"},"
        "{\"role\":\"user\",\"content\":\"and tomorrow?\"}]}";
    json_t *a = NULL, *c = NULL;
    CHECK(tsrv_post(s, "/v1/messages/count_tokens", anth, NULL, &a) == 200);
    CHECK(tsrv_post(s, "/v1/chat/completions", chat, NULL, &c) == 200);
    long long na = json_integer_value(json_object_get(a, "input_tokens"));
    long long nc = json_integer_value(json_object_get(json_object_get(c, "usage"), "prompt_tokens"));
    CHECKF(na > 40 && na == nc, "count_tokens %lld vs chat prompt_tokens %lld", na, nc);
    json_decref(a);
    json_decref(c);
}

struct anth_bad {
    const char *path, *body, *headers;
    int         status;
    const char *type, *needle;
};

static void check_bad(struct test_ctx *t, struct tsrv *s, const struct anth_bad *b)
{
    json_t     *r   = NULL;
    int         st  = tsrv_post(s, b->path, b->body, b->headers, &r);
    json_t     *e   = json_object_get(r, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *ty  = json_string_value(json_object_get(e, "type"));
    CHECKF(st == b->status, "%.80s: status %d, want %d (%s)", b->body, st, b->status, msg ? msg : "");
    CHECKF(r && !strcmp(test_str(json_string_value(json_object_get(r, "type"))), "error"), "%.80s: not Anthropic's error shape",
           b->body);
    CHECKF(ty && !strcmp(ty, b->type), "%.80s: error type %s, want %s", b->body, ty ? ty : "(none)", b->type);
    CHECKF(msg && strstr(msg, b->needle), "%.80s: message '%s' lacks '%s'", b->body, msg ? msg : "", b->needle);
    json_decref(r);
}

/* tool_choice tool: the prompt grows by the call's opening; no DSML in any text block. */
static void forced_live(struct test_ctx *t, struct tsrv *s)
{
#define BASE(extra)                                                                                          \
    "{\"model\":\"srv-tiny\",\"max_tokens\":24,\"temperature\":0,\"tools\":[{\"name\":\"get_weather\","                    \
    "\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}],"                          \
    "\"messages\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"}]" extra "}"
    json_t *cnt = NULL, *r = NULL;
    CHECK(tsrv_post(s, "/v1/messages/count_tokens", BASE(""), NULL, &cnt) == 200);
    CHECK(tsrv_post(s, "/v1/messages", BASE(",\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_weather\"}"), NULL, &r) ==
          200);
#undef BASE
    long long plain = json_integer_value(json_object_get(cnt, "input_tokens"));
    long long in    = usage_of(r, "input_tokens") + usage_of(r, "cache_read_input_tokens");
    CHECKF(in > plain + 3, "forced prompt %lld tokens, plain %lld", in, plain);
    char *txt = json_dumps(r, 0);
    CHECKF(txt && !strstr(txt, "DSML"), "DSML in a forced answer: %s", txt ? txt : "");
    free(txt);
    json_decref(cnt);
    json_decref(r);
    /* the same through chat/completions: "required" */
    r = NULL;
    CHECK(tsrv_post(s, "/v1/chat/completions",
                    "{\"max_tokens\":24,\"temperature\":0,\"tool_choice\":\"required\",\"tools\":[{\"type\":\"function\","
                    "\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}}],\"messages\":[{\"role\":"
                    "\"user\",\"content\":\"weather in Paris?\"}]}", NULL, &r) == 200);
    txt = r ? json_dumps(r, 0) : NULL;
    CHECKF(txt && !strstr(txt, "DSML"), "DSML in a forced chat answer: %s", txt ? txt : "");
    free(txt);
    json_decref(r);
}

/* thinking.budget_tokens: past it </think> is forced, so a text block follows a short
 * thinking block (the random model alone would think on to max_tokens). */
static void think_budget(struct test_ctx *t, struct tsrv *s)
{
    json_t *r = NULL;
    CHECK(tsrv_post(s, "/v1/messages", "{\"model\":\"srv-tiny\",\"max_tokens\":30,\"temperature\":0,\"thinking\":{"
                                     "\"type\":\"enabled\",\"budget_tokens\":3},\"messages\":[{\"role\":\"user\","
                                     "\"content\":\"hi\"}]}", NULL, &r) == 200);
    json_t     *c  = json_object_get(r, "content");
    const char *t0 = json_string_value(json_object_get(json_array_get(c, 0), "type"));
    const char *t1 = json_string_value(json_object_get(json_array_get(c, 1), "type"));
    CHECKF(t0 && t1 && !strcmp(t0, "thinking") && !strcmp(t1, "text"), "blocks %s, %s", t0 ? t0 : "-", t1 ? t1 : "-");
    json_decref(r);
}

void tanth_test_messages_api(struct test_ctx *t, struct tsrv *s)
{
    think_budget(t, s);
    same_as_chat(t, s);
    count_matches(t, s);
    forced_live(t, s);
    static const char M[] = "/v1/messages", C[] = "/v1/messages/count_tokens";
#define U "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define T "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]"
    static const struct anth_bad bad[] = {
        { M, "{\"model\":\"srv-tiny\"," U "}", NULL, 400, "invalid_request_error", "max_tokens" },
        { M, "{\"max_tokens\":4," U "}", NULL, 400, "invalid_request_error", "model" },
        { M, "{\"model\":\"claude-x\",\"max_tokens\":4," U "}", NULL, 404, "not_found_error", "claude-x" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4,\"messages\":[]}", NULL, 400, "invalid_request_error", "non-empty" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4," U ",\"temperature\":1.5}", NULL, 400, "invalid_request_error",
          "temperature" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":0," U "}", NULL, 400, "invalid_request_error", "max_tokens" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4," U ",\"frobnicate\":1}", NULL, 400, "invalid_request_error",
          "frobnicate" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", NULL, 400,
          "invalid_request_error", "role" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
             "\"source\":{}}]}]}", NULL, 400, "invalid_request_error", "image" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":"
             "\"assistant\",\"content\":\"b\"}]}", NULL, 400, "invalid_request_error", "prefill" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4," U ",\"tools\":[{\"name\":\"f\"}]}", NULL, 400,
          "invalid_request_error", "input_schema" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4," U ",\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}]}",
          NULL, 400, "invalid_request_error", "client tools" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4," U ",\"tool_choice\":{\"type\":\"any\"}}", NULL, 400,
          "invalid_request_error", "needs tools" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4," U "," T ",\"tool_choice\":{\"type\":\"tool\",\"name\":\"g\"}}",
          NULL, 400, "invalid_request_error", "not in tools" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4," U "," T ",\"tool_choice\":{\"type\":\"any\"},\"thinking\":{"
             "\"type\":\"enabled\",\"budget_tokens\":1024}}", NULL, 400, "invalid_request_error", "thinking" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4," U ",\"thinking\":{\"type\":\"sometimes\"}}", NULL, 400,
          "invalid_request_error", "thinking" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4," U ",\"stop_sequences\":\"x\"}", NULL, 400,
          "invalid_request_error", "stop_sequences" },
        { M, "{\"model\":\"srv-tiny\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
             "\"tool_result\"}]}]}", NULL, 400, "invalid_request_error", "tool_use_id" },
        { M, "{\"model\":\"srv-tiny\", \"max_tokens\": [", NULL, 400, "invalid_request_error", "not valid JSON" },
        { C, "{\"model\":\"srv-tiny\"}", NULL, 400, "invalid_request_error", "messages" },
    };
#undef U
#undef T
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) check_bad(t, s, &bad[i]);
    /* a prompt longer than the context */
    size_t cap = 64 * 1024, k;
    char  *big = malloc(cap);
    k          = (size_t)snprintf(big, cap, "{\"model\":\"srv-tiny\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < 3000; i++) k += (size_t)snprintf(big + k, cap - k, "word%d ", i);
    snprintf(big + k, cap - k, "\"}]}");
    struct anth_bad too_long = { M, big, NULL, 400, "invalid_request_error", "prompt is too long" };
    check_bad(t, s, &too_long);
    free(big);
    /* max_tokens above what the context (2048) leaves is clipped, not refused (agents ask for
     * 32000); only a limit above the model's max_position_embeddings (4096 here) is a 400
     * (docs/SERVER.md, "max_tokens"; test_server_limits.c sends that one) */
    json_t *r = NULL;
    CHECK(tsrv_post(s, M, "{\"model\":\"srv-tiny\",\"max_tokens\":4096,\"temperature\":0,\"stop_sequences\":[\"e\"],"
                          "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", NULL, &r) == 200);
    const char *sr = json_string_value(json_object_get(r, "stop_reason"));
    CHECKF(sr && (!strcmp(sr, "end_turn") || !strcmp(sr, "max_tokens") ||
                  (!strcmp(sr, "stop_sequence") && !strcmp(test_str(json_string_value(json_object_get(r, "stop_sequence"))), "e"))),
           "stop_reason %s", sr ? sr : "");
    json_decref(r);
}

/* With --api-key: x-api-key works as Authorization: Bearer does; errors in Anthropic's shape. */
void tanth_test_api_key(struct test_ctx *t, struct tsrv *s, const char *key)
{
    char h[256];
    snprintf(h, sizeof(h), "x-api-key: %s\r\n", key);
    static const char body[] = "{\"model\":\"srv-tiny\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    CHECK(tsrv_post(s, "/v1/messages", body, h, NULL) == 200);
    struct anth_bad none  = { "/v1/messages", body, NULL, 401, "authentication_error", "API key" };
    struct anth_bad wrong = { "/v1/messages", body, "x-api-key: nope\r\n", 401, "authentication_error", "API key" };
    check_bad(t, s, &none);
    check_bad(t, s, &wrong);
}
