/*
 * test_engram_map.c - the Engram token map computed from a tokenizer (src/model/engram_map_tok.c)
 * and the choice of source for a checkpoint directory (dsv4_engram_map_open), against
 * tests/fixtures/engram/token_map.json: the maps of the test checkpoint's tokenizer and of a
 * tokenizer of edge cases, written by tools/ref/engram_map_ref.py (docs/ENGRAM.md, "The token
 * map"). Group engram (its table is in test_engram_hash.c; test_engram.h).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/io.h"
#include "model/engram_map.h"
#include "test_cases.h"
#include "test_engram.h"

#define FIXTURE "tests/fixtures/engram/token_map.json"

static json_t *load_fixture(struct test_ctx *t)
{
    return test_engram_fixture(t, FIXTURE, "/usr/bin/python3 tools/ref/engram_map_ref.py");
}

/* Checks map[0..n) against the fixture's set (its length and every element). */
static void check_map(struct test_ctx *t, json_t *set, const int32_t *map, int64_t n)
{
    json_t *want = json_object_get(set, "map");
    CHECKF((size_t)n == json_array_size(want), "%lld ids, the reference has %zu", (long long)n,
           json_array_size(want));
    int bad = 0;
    for (int64_t i = 0; i < n && (size_t)i < json_array_size(want); i++) {
        json_int_t w = json_integer_value(json_array_get(want, (size_t)i));
        if (map[i] != w && bad++ < 5)
            CHECKF(0, "token %lld: compressed id %d, the reference has %lld", (long long)i, map[i],
                   (long long)w);
    }
    CHECKF(bad == 0, "%d token ids differ from the reference", bad);
}

void test_engram_map_tokenizer(struct test_ctx *t)
{
    json_t     *root = load_fixture(t);
    const char *sets[] = { "kjv", "edge" };
    for (int s = 0; root && s < 2; s++) {
        json_t         *set = json_object_get(root, sets[s]);
        struct dsv4_err err = { 0 };
        dsv4_tokenizer *tok = NULL;
        const char     *path = json_string_value(json_object_get(set, "tokenizer"));
        CHECKF(path && dsv4_tokenizer_load(&tok, path, &err) == 0, "%s: %s", sets[s], err.msg);
        if (!tok) continue;
        int32_t *map = NULL;
        int64_t  n   = 0;
        int64_t  c   = json_integer_value(json_object_get(set, "compressed_vocab"));
        /* any count first, so that a difference shows as the token ids that differ */
        CHECKF(dsv4_engram_map_from_tokenizer(tok, 0, &map, &n, &err) == 0, "%s: %s", sets[s], err.msg);
        if (map) check_map(t, set, map, n);
        free(map);
        CHECKF(dsv4_engram_map_from_tokenizer(tok, c, &map, &n, &err) == 0, "%s: %s", sets[s], err.msg);
        free(map);
        CHECK(dsv4_engram_map_from_tokenizer(tok, c + 1, &map, &n, &err) == DSV4_EFORMAT && !map);
        CHECKF(strstr(err.msg, "engram_compressed_vocab_size"), "%s", err.msg);
        dsv4_tokenizer_free(tok);
    }
    json_decref(root);
}

static uint64_t fnv1a64(const int32_t *map, int64_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) /* little-endian bytes, as the reference hashes them */
            h = (h ^ (((uint32_t)map[i] >> (8 * b)) & 0xFF)) * 0x100000001B3ull;
    return h;
}

/* The real DeepSeek-V3 tokenizer (128,815 ids, CJK, code, every added token): the reference's
 * map as its hash and every 1000th entry. */
void test_engram_map_deepseek_v3(struct test_ctx *t)
{
    json_t         *root = load_fixture(t);
    json_t         *set  = json_object_get(root, "deepseek_v3");
    struct dsv4_err err  = { 0 };
    dsv4_tokenizer *tok  = NULL;
    const char     *path = json_string_value(json_object_get(set, "tokenizer"));
    CHECKF(path && dsv4_tokenizer_load(&tok, path, &err) == 0, "%s", err.msg);
    int32_t *map = NULL;
    int64_t  n   = 0, c = json_integer_value(json_object_get(set, "compressed_vocab"));
    CHECKF(tok && dsv4_engram_map_from_tokenizer(tok, c, &map, &n, &err) == 0, "%s", err.msg);
    CHECK(n == json_integer_value(json_object_get(set, "n_vocab")));
    size_t  i;
    json_t *e;
    json_array_foreach(json_object_get(set, "sample"), i, e) {
        int64_t id   = json_integer_value(json_array_get(e, 0));
        int64_t want = json_integer_value(json_array_get(e, 1));
        CHECKF(map && id < n && map[id] == want, "token %lld: %d, the reference has %lld", (long long)id,
               map && id < n ? map[id] : -1, (long long)want);
    }
    char hash[17];
    snprintf(hash, sizeof(hash), "%016llx", map ? (unsigned long long)fnv1a64(map, n) : 0ull);
    const char *want = json_string_value(json_object_get(set, "fnv1a64"));
    CHECKF(want && !strcmp(hash, want), "map hash %s, the reference's %s", hash, want ? want : "-");
    free(map);
    dsv4_tokenizer_free(tok);
    json_decref(root);
}

/* dsv4's map of the tokenizer at path against the one the Hugging Face tokenizers library
 * computes (tests/tokenizer/engram_map_hf.mjs): every element and the count. */
static void check_against_hf(struct test_ctx *t, const char *path)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof(cmd), "node tests/tokenizer/engram_map_hf.mjs %s", path);
    int          rc = test_run(cmd, &out);
    json_error_t je;
    json_t      *hf = rc == 0 ? json_loads(out, 0, &je) : NULL;
    CHECKF(hf != NULL, "%s: exit %d: %.300s", cmd, rc, out ? out : "");
    free(out);
    struct dsv4_err err = { 0 };
    dsv4_tokenizer *tok = NULL;
    int32_t        *map = NULL;
    int64_t         n   = 0;
    CHECKF(dsv4_tokenizer_load(&tok, path, &err) == 0, "%s", err.msg);
    CHECKF(tok && dsv4_engram_map_from_tokenizer(tok, 0, &map, &n, &err) == 0, "%s", err.msg);
    if (hf && map) check_map(t, hf, map, n);
    free(map);
    int64_t c = json_integer_value(json_object_get(hf, "compressed_vocab"));
    CHECKF(!tok || dsv4_engram_map_from_tokenizer(tok, c, &map, &n, &err) == 0, "%s", err.msg);
    if (tok) free(map);
    dsv4_tokenizer_free(tok);
    json_decref(hf);
}

/* The three tokenizers of the fixture, computed by the library the official code runs on. */
void test_engram_map_hf_tokenizers(struct test_ctx *t)
{
    json_t     *root   = load_fixture(t);
    const char *sets[] = { "kjv", "edge", "deepseek_v3" };
    for (int s = 0; root && s < 3; s++) {
        const char *path = json_string_value(json_object_get(json_object_get(root, sets[s]), "tokenizer"));
        CHECKF(path != NULL, "%s: no tokenizer in the fixture", sets[s]);
        if (path) check_against_hf(t, path);
    }
    json_decref(root);
}

/* A fresh directory under the run's tmpdir, into path. */
static void make_dir(struct test_ctx *t, const char *name, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", t->tmpdir, name);
    CHECKF(mkdir(path, 0755) == 0, "mkdir %s", path);
}

/* Copies the file at from to dir/name. */
static void copy_file(struct test_ctx *t, const char *from, const char *dir, const char *name)
{
    char  *text = NULL;
    size_t len  = 0;
    char   to[1100];
    snprintf(to, sizeof(to), "%s/%s", dir, name);
    struct dsv4_err err;
    CHECKF(dsv4_read_file(from, &text, &len, (size_t)64 << 20, &err) == 0, "%s", err.msg);
    CHECK(text && test_write_file(to, text, len) == 0);
    free(text);
}

/* A map file for the kjv set that differs from the computed map everywhere it can (c - 1 - id). */
static char *mirrored_map(json_t *set, int64_t c)
{
    json_t *arr = json_array(), *v;
    size_t  i;
    json_array_foreach(json_object_get(set, "map"), i, v)
        json_array_append_new(arr, json_integer(c - 1 - json_integer_value(v)));
    char *text = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    return text;
}

void test_engram_map_open(struct test_ctx *t)
{
    json_t *root = load_fixture(t);
    json_t *set  = json_object_get(root, "kjv");
    int64_t c    = json_integer_value(json_object_get(set, "compressed_vocab"));
    char    dir[512], path[600];
    int32_t *map = NULL;
    int64_t  n   = 0;
    enum dsv4_engram_map_source src = DSV4_ENGRAM_MAP_SOURCE_FILE;
    struct dsv4_err             err = { 0 };

    make_dir(t, "engram_map_open", dir, sizeof(dir));
    CHECK(dsv4_engram_map_open(dir, 0, c, &map, &n, &src, &err) == DSV4_EIO && !map);
    CHECKF(strstr(err.msg, "no engram_token_map.json and no tokenizer.json"), "%s", err.msg);

    copy_file(t, json_string_value(json_object_get(set, "tokenizer")), dir, "tokenizer.json");
    CHECKF(dsv4_engram_map_open(dir, 0, c, &map, &n, &src, &err) == 0, "%s", err.msg);
    CHECK(src == DSV4_ENGRAM_MAP_SOURCE_TOKENIZER);
    CHECK(strcmp(dsv4_engram_map_source_name(src), "tokenizer.json") == 0);
    if (map) check_map(t, set, map, n);
    free(map);
    CHECK(dsv4_engram_map_open(dir, n + 1, c, &map, &n, &src, &err) == DSV4_EFORMAT && !map);

    char *text = mirrored_map(set, c);
    snprintf(path, sizeof(path), "%s/engram_token_map.json", dir);
    CHECK(text && test_write_file(path, text, strlen(text)) == 0);
    free(text);
    CHECKF(dsv4_engram_map_open(dir, 0, c, &map, &n, &src, &err) == 0, "%s", err.msg);
    CHECK(src == DSV4_ENGRAM_MAP_SOURCE_FILE); /* the file wins over the tokenizer */
    int64_t first = json_integer_value(json_array_get(json_object_get(set, "map"), 0));
    CHECK(map && n > 0 && map[0] == c - 1 - first);
    free(map);
    json_decref(root);
}

/* Writes text as dir/tokenizer.json and opens the map; the code, the message in err. */
static int open_with(struct test_ctx *t, const char *dir, const char *text, struct dsv4_err *err)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    CHECK(test_write_file(path, text, strlen(text)) == 0);
    int32_t                    *map = NULL;
    int64_t                     n   = 0;
    enum dsv4_engram_map_source src;
    int                         rc = dsv4_engram_map_open(dir, 0, 0, &map, &n, &src, err);
    CHECK(rc != 0 || map != NULL);
    free(map);
    return rc;
}

/* The edge tokenizer with its last added token removed but the one before it kept: an id gap. */
static char *tokenizer_with_gap(void)
{
    json_t *doc   = json_load_file("tests/fixtures/engram/map_tokenizer.json", 0, NULL);
    json_t *added = json_object_get(doc, "added_tokens");
    size_t  k     = json_array_size(added);
    if (k < 2) {
        json_decref(doc);
        return NULL;
    }
    json_array_remove(added, k - 2);
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return text;
}

void test_engram_map_bad_tokenizer(struct test_ctx *t)
{
    char            dir[512];
    struct dsv4_err err = { 0 };
    make_dir(t, "engram_map_bad", dir, sizeof(dir));
    int rc = open_with(t, dir, "{\"model\": ", &err);
    CHECKF(rc == DSV4_EFORMAT && strstr(err.msg, "invalid JSON"), "rc %d: %s", rc, err.msg);
    rc = open_with(t, dir, "[1, 2]", &err);
    CHECKF(rc == DSV4_EFORMAT && strstr(err.msg, "JSON object"), "rc %d: %s", rc, err.msg);
    char *gap = tokenizer_with_gap();
    CHECK(gap != NULL);
    rc = gap ? open_with(t, dir, gap, &err) : -1;
    CHECKF(rc == DSV4_EUNSUPPORTED && strstr(err.msg, "no token id"), "rc %d: %s", rc, err.msg);
    free(gap);
}
