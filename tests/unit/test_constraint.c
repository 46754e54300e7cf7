/*
 * test_constraint.c - constrained decoding to JSON (src/tok/json_constraint.c) on the demo
 * model's tokenizer:
 *   - texts, tokenized, pass the mask token by token and end complete exactly when they are
 *     valid for the schema (valid and invalid cases of every construct);
 *   - random walks: 150 completions drawn from random logits under the mask (greedy and
 *     sampled) always end in a text that jansson parses and that has the schema's shape
 *     (checked by a small independent validator here, not by the automaton);
 *   - schemas outside the subset are refused with a message naming the keyword.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dsv4.h"
#include "test.h"
#include "test_cases.h"

static dsv4_tokenizer  *g_tok;
static dsv4_json_vocab *g_vocab;

static bool setup(struct test_ctx *t)
{
    if (g_vocab) return true;
    struct dsv4_err err;
    CHECKF(dsv4_tokenizer_load(&g_tok, "models/kjv-v4-tiny/tokenizer.json", &err) == DSV4_OK, "%s", err.msg);
    if (!g_tok) return false;
    CHECKF(dsv4_json_vocab_new(&g_vocab, g_tok, &err) == DSV4_OK, "%s", err.msg);
    return g_vocab != NULL;
}

static const char PERSON[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bc\",null]},\"maxItems\":2},"
    "\"pet\":{\"type\":[\"object\",\"null\"],\"properties\":{\"ok\":{\"type\":\"boolean\"},\"w\":{\"type\":\"number\"}},"
    "\"required\":[\"ok\",\"w\"],\"additionalProperties\":false}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"pet\"],\"additionalProperties\":false}";

/* Whether text passes the mask token by token and ends complete. */
static bool accepts(struct test_ctx *t, const char *schema, const char *text)
{
    dsv4_constraint *c = NULL;
    struct dsv4_err  err;
    CHECKF(dsv4_constraint_new_json(&c, g_vocab, g_tok, schema, schema ? strlen(schema) : 0, -1, &err) == DSV4_OK,
           "%s", err.msg);
    if (!c) return false;
    size_t   n = 0, cap = 3 * strlen(text) + 1;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    dsv4_tokenizer_encode(g_tok, text, strlen(text), 0, ids, cap, &n, NULL);
    int32_t V      = dsv4_tokenizer_n_vocab(g_tok);
    float  *logits = malloc(sizeof(float) * (size_t)V);
    bool    ok     = true;
    for (size_t i = 0; i < n && ok; i++) {
        for (int32_t k = 0; k < V; k++) logits[k] = 0;
        dsv4_constraint_mask(c, logits);
        ok = isfinite(logits[ids[i]]);
        if (ok) dsv4_constraint_accept(c, ids[i]);
    }
    if (ok) { /* the end: EOS allowed exactly when complete */
        for (int32_t k = 0; k < V; k++) logits[k] = 0;
        dsv4_constraint_mask(c, logits);
        bool eos = isfinite(logits[dsv4_tokenizer_eos(g_tok)]);
        CHECKF(eos == dsv4_constraint_done(c), "'%s': EOS allowed %d, done %d", text, eos, dsv4_constraint_done(c));
        ok = dsv4_constraint_done(c);
    }
    free(logits);
    free(ids);
    dsv4_constraint_free(c);
    return ok;
}

static void test_texts(struct test_ctx *t)
{
    if (!setup(t)) return;
    static const struct {
        bool        schema, valid;
        const char *text;
    } cases[] = {
        { false, true, "{}" },
        { false, true, "{\"a\": 1, \"b\": [true, null, \"x\\n\\u00e9\"], \"c\": {\"d\": -1.5e3}}" },
        { false, true, "{\n  \"a\": [\n    0.25\n  ]\n}" },
        { false, false, "{  \"a\": 1}" },
        { false, false, "{\n\n\"a\": 1}" },
        { false, false, "[1]" },
        { false, false, "\"x\"" },
        { false, false, "{\"a\" 1}" },
        { false, false, "{\"a\":1,}" },
        { false, false, "{\"a\":01}" },
        { false, false, "{\"a\":1} x" },
        { false, false, "{\"a\":\"\\q\"}" },
        { false, false, "{\"a\":\"\x01\"}" },
        { false, false, "{\"a\":1" },
        { false, false, "{\"a\":          1}" },
        { true, true, "{\"name\":\"Ann\",\"age\":31,\"tags\":[\"a\",null],\"pet\":{\"ok\":true,\"w\":2.5}}" },
        { true, true, "{\"name\":\"\",\"age\":-7,\"tags\":[],\"pet\":null}" },
        { true, true, "{\"name\":\"éèêëà\",\"age\":0,\"tags\":[\"bc\"],\"pet\":null}" },
        { true, false, "{\"age\":31,\"name\":\"Ann\",\"tags\":[],\"pet\":null}" },             /* order */
        { true, false, "{\"name\":\"Ann\",\"age\":3.5,\"tags\":[],\"pet\":null}" },            /* integer */
        { true, false, "{\"name\":\"Ann\",\"age\":3,\"tags\":[\"c\"],\"pet\":null}" },         /* enum */
        { true, false, "{\"name\":\"Ann\",\"age\":3,\"tags\":[\"a\",\"a\",\"a\"],\"pet\":null}" }, /* maxItems */
        { true, false, "{\"name\":\"Annabel\",\"age\":3,\"tags\":[],\"pet\":null}" },          /* maxLength */
        { true, false, "{\"name\":\"Ann\",\"age\":3,\"tags\":[]}" },                           /* missing */
        { true, false, "{\"name\":\"Ann\",\"age\":3,\"tags\":[],\"pet\":null,\"x\":1}" },      /* extra */
        { true, false, "{\"name\":\"Ann\",\"age\":3,\"tags\":[],\"pet\":{\"ok\":1,\"w\":2}}" }, /* boolean */
        { true, false, "{\"name\":\"Ann\",\"age\":123456789012345678,\"tags\":[],\"pet\":null}" }, /* digits */
        { true, false, "{\"name\":\"Ann\",\"age\":1,\"tags\":[],\"pet\":{\"ok\":true,\"w\":1e400}}" }, /* exponent */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool got = accepts(t, cases[i].schema ? PERSON : NULL, cases[i].text);
        CHECKF(got == cases[i].valid, "%s schema: '%s' accepted %d, want %d", cases[i].schema ? "person" : "object",
               cases[i].text, got, cases[i].valid);
    }
}

/* An independent check of PERSON's shape on a parsed value. */
static bool person_ok(json_t *v)
{
    if (!json_is_object(v) || json_object_size(v) != 4) return false;
    json_t *name = json_object_get(v, "name"), *age = json_object_get(v, "age");
    json_t *tags = json_object_get(v, "tags"), *pet = json_object_get(v, "pet");
    if (!json_is_string(name) || !json_is_integer(age) || !json_is_array(tags) || json_array_size(tags) > 2) return false;
    size_t  i;
    json_t *x;
    json_array_foreach(tags, i, x) if (!(json_is_null(x) || (json_is_string(x) && (!strcmp(test_str(json_string_value(x)), "a") ||
                                                                                  !strcmp(test_str(json_string_value(x)), "bc")))))
        return false;
    if (json_is_null(pet)) return true;
    return json_is_object(pet) && json_object_size(pet) == 2 && json_is_boolean(json_object_get(pet, "ok")) &&
           json_is_number(json_object_get(pet, "w"));
}

static void test_random_walks(struct test_ctx *t)
{
    if (!setup(t)) return;
    int32_t            V      = dsv4_tokenizer_n_vocab(g_tok);
    float             *logits = malloc(sizeof(float) * (size_t)V);
    unsigned long long rng    = 99;
    int                complete = 0;
    int walks = TEST_SANITIZED ? 40 : 150;
    for (int walk = 0; walk < walks; walk++) {
        bool             schema = walk % 2 == 0;
        dsv4_constraint *c      = NULL;
        struct dsv4_sampler_params sp;
        dsv4_sampler_params_default(&sp);
        sp.temperature = walk % 3 ? 1.0f : 0;
        sp.seed        = (uint64_t)walk;
        dsv4_sampler   *s = NULL;
        CHECK(dsv4_constraint_new_json(&c, g_vocab, g_tok, schema ? PERSON : NULL, schema ? strlen(PERSON) : 0, -1,
                                       NULL) == DSV4_OK);
        sp.constraint = c;
        CHECK(dsv4_sampler_create(&s, V, &sp, NULL) == DSV4_OK);
        if (!c || !s) break;
        char   text[8192];
        size_t len = 0;
        for (int step = 0; step < 300; step++) {
            /* random logits, the EOS and whitespace made likely (the worst case for ending) */
            for (int32_t k = 0; k < V; k++) logits[k] = test_rand_f32(&rng) * 4;
            logits[dsv4_tokenizer_eos(g_tok)] += 3;
            int32_t tok = dsv4_sampler_sample(s, logits, NULL);
            if (tok == dsv4_tokenizer_eos(g_tok)) break;
            size_t k = 0;
            dsv4_tokenizer_decode(g_tok, &tok, 1, text + len, sizeof(text) - len - 1, &k, NULL);
            len += k;
            dsv4_sampler_accept(s, tok);
        }
        text[len] = '\0';
        if (dsv4_constraint_done(c)) {
            complete++;
            json_error_t je;
            json_t      *v = json_loads(text, 0, &je);
            CHECKF(v && json_is_object(v), "walk %d: '%s' does not parse as an object: %s", walk, text, je.text);
            if (schema) CHECKF(person_ok(v), "walk %d: '%s' does not fit the schema", walk, text);
            json_decref(v);
        }
        dsv4_sampler_free(s);
        dsv4_constraint_free(c);
    }
    CHECKF(complete > walks / 3, "only %d of %d walks completed within 300 tokens", complete, walks);
    free(logits);
}

/* A thinking budget: past 3 reasoning tokens only </think>; after it, nothing masked (alone)
 * or the JSON (on a JSON constraint). */
static void test_think_budget(struct test_ctx *t)
{
    if (!setup(t)) return;
    int32_t V = dsv4_tokenizer_n_vocab(g_tok), think_end;
    CHECK(dsv4_tokenizer_token_id(g_tok, "</think>", &think_end, NULL) == DSV4_OK);
    float *l = malloc(sizeof(float) * (size_t)V);
    for (int json = 0; json < 2; json++) {
        dsv4_constraint *c = NULL;
        if (json) {
            CHECK(dsv4_constraint_new_json(&c, g_vocab, g_tok, NULL, 0, think_end, NULL) == DSV4_OK);
            if (c) dsv4_constraint_set_think_budget(c, 3);
        } else {
            CHECK(dsv4_constraint_new_think(&c, g_tok, think_end, 3, NULL) == DSV4_OK);
        }
        if (!c) break;
        for (int step = 0; step < 5; step++) {
            for (int32_t i = 0; i < V; i++) l[i] = 0;
            dsv4_constraint_mask(c, l);
            int finite = 0;
            for (int32_t i = 0; i < V; i++) finite += isfinite(l[i]);
            if (step < 3) CHECKF(finite == V, "json %d step %d: %d tokens allowed while thinking", json, step, finite);
            else if (step == 3) CHECKF(finite == 1 && isfinite(l[think_end]), "json %d: past the budget %d allowed", json,
                                       finite);
            else CHECKF(json ? finite < V && !isfinite(l[think_end]) : finite == V, "json %d after </think>: %d allowed",
                        json, finite);
            dsv4_constraint_accept(c, step == 3 ? think_end : 100 + step);
        }
        dsv4_constraint_free(c);
    }
    free(l);
}

static int code_points(const char *s)
{
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* Strict tool calls: 60 random walks (forced by name, forced, or unforced after free text
 * that opens a block) end in a DSML block that dsv4_chat_parse reads as calls whose
 * arguments fit their tools' schemas. */
static void test_strict_call(struct test_ctx *t)
{
    if (!setup(t)) return;
    static const char tools[] =
        "[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","
        "\"maxLength\":10},\"days\":{\"type\":\"integer\"},\"units\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\","
        "\"days\",\"units\"],\"additionalProperties\":false}},{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"tz\":{\"type\":\"string\",\"maxLength\":5}},\"required\":[\"tz\"],\"additionalProperties\":false}}]";
    int32_t            V = dsv4_tokenizer_n_vocab(g_tok);
    float             *l = malloc(sizeof(float) * (size_t)V);
    unsigned long long rng = 7;
    int                parsed = 0;
    for (int w = 0; w < 60; w++) {
        /* w % 3: 0 forced by name, 1 forced (any tool), 2 unforced: free text, then the model opens a block */
        const char      *name = w % 3 == 0 ? "get_time" : NULL;
        dsv4_constraint *c    = NULL;
        struct dsv4_err  err;
        int rc0 = w % 3 == 2 ? dsv4_constraint_new_tools(&c, g_vocab, g_tok, tools, strlen(tools), -1, &err)
                             : dsv4_constraint_new_call(&c, g_vocab, g_tok, tools, strlen(tools), name, &err);
        CHECKF(rc0 == DSV4_OK, "%s", err.msg);
        struct dsv4_sampler_params sp;
        dsv4_sampler_params_default(&sp);
        sp.temperature   = 1;
        sp.seed          = (uint64_t)w;
        sp.constraint    = c;
        dsv4_sampler *s  = NULL;
        CHECK(c && dsv4_sampler_create(&s, V, &sp, NULL) == DSV4_OK);
        if (!s) {
            dsv4_constraint_free(c);
            break;
        }
        static char text[65536];
        size_t      len = (size_t)snprintf(text, sizeof(text), "%s\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"%s%s",
                                      w % 3 == 2 ? "Let me look." : "", name ? name : "", name ? "\">\n" : "");
        if (w % 3 == 2) { /* the free text and the opening, as the model wrote them, through accept */
            int32_t ids[256];
            size_t  n_ids = 0;
            dsv4_tokenizer_encode(g_tok, text, len, 0, ids, 256, &n_ids, NULL);
            for (size_t i = 0; i < n_ids; i++) dsv4_sampler_accept(s, ids[i]);
        }
        for (int k = 0; k < 3000 && len < sizeof(text) - 256; k++) {
            for (int32_t i = 0; i < V; i++) l[i] = test_rand_f32(&rng) * 4;
            int32_t tok = dsv4_sampler_sample(s, l, NULL);
            if (tok == dsv4_tokenizer_eos(g_tok)) break;
            size_t n = 0;
            if (dsv4_tokenizer_is_added(g_tok, tok)) {
                const char *str = dsv4_tokenizer_token_str(g_tok, tok);
                memcpy(text + len, str, n = strlen(str));
            } else {
                dsv4_tokenizer_decode(g_tok, &tok, 1, text + len, sizeof(text) - len - 64, &n, NULL);
            }
            len += n;
            dsv4_sampler_accept(s, tok);
        }
        CHECKF(dsv4_constraint_done(c), "walk %d did not end the call", w);
        text[len] = '\0';
        strcat(text, "<｜end▁of▁sentence｜>");
        struct dsv4_chat_parsed out;
        int                     rc = dsv4_chat_parse(text, strlen(text), DSV4_CHAT_MODE_CHAT, &out, &err);
        CHECKF(rc == DSV4_OK && out.n_calls >= 1, "walk %d: rc %d (%s), %zu calls: %s", w, rc, rc ? err.msg : "",
               rc ? (size_t)0 : out.n_calls, text);
        bool all = rc == DSV4_OK && out.n_calls >= 1;
        for (size_t ci = 0; rc == DSV4_OK && ci < out.n_calls; ci++) {
            json_t     *a  = json_loads(out.calls[ci].arguments, 0, NULL);
            const char *nm = out.calls[ci].name;
            bool        ok = a && (!name || !strcmp(nm, name));
            if (ok && !strcmp(nm, "get_time")) {
                json_t *tz = json_object_get(a, "tz");
                ok = json_object_size(a) == 1 && json_is_string(tz) && code_points(json_string_value(tz)) <= 5;
            } else if (ok) {
                json_t     *u = json_object_get(a, "units"), *city = json_object_get(a, "city");
                const char *us = json_string_value(u);
                ok = json_object_size(a) == 3 && json_is_string(city) && code_points(json_string_value(city)) <= 10 &&
                     json_is_integer(json_object_get(a, "days")) && us && (!strcmp(us, "c") || !strcmp(us, "f"));
            }
            CHECKF(ok, "walk %d: %s(%s) does not fit its schema", w, nm, out.calls[ci].arguments);
            all = all && ok;
            json_decref(a);
        }
        if (rc == DSV4_OK) dsv4_chat_parsed_free(&out);
        parsed += all;
        dsv4_sampler_free(s);
        dsv4_constraint_free(c);
    }
    CHECK(parsed == 60);
    free(l);
}

static void test_refused(struct test_ctx *t)
{
    if (!setup(t)) return;
    static const struct {
        const char *schema, *needle;
    } bad[] = {
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[]}", "required" },
        { "{\"type\":\"string\",\"pattern\":\"x\"}", "pattern" },
        { "{\"anyOf\":[]}", "anyOf" },
        { "{\"type\":\"date\"}", "date" },
        { "{\"enum\":[1,10]}", "prefix" },
        { "{\"type\":[\"string\",\"integer\"]}", "type list" },
        { "[1]", "object" },
        { "{", "JSON" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dsv4_constraint *c = NULL;
        struct dsv4_err  err;
        int rc = dsv4_constraint_new_json(&c, g_vocab, g_tok, bad[i].schema, strlen(bad[i].schema), -1, &err);
        CHECKF(rc != DSV4_OK && !c && strstr(err.msg, bad[i].needle), "%s: rc %d, '%s'", bad[i].schema, rc,
               rc ? err.msg : "");
        dsv4_constraint_free(c);
    }
    /* the last test of the group frees what its tests shared */
    dsv4_json_vocab_free(g_vocab);
    dsv4_tokenizer_free(g_tok);
    g_vocab = NULL;
    g_tok   = NULL;
}

const struct test_case test_group_constraint[] = {
    { "texts", test_texts },
    { "random_walks", test_random_walks },
    { "think_budget", test_think_budget },
    { "strict_call", test_strict_call },
    { "refused_schemas", test_refused },
    { NULL, NULL },
};
