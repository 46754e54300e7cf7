/*
 * test_engram_hash.c - the Engram row indices (src/model/engram_hash.c), numpy's generator
 * (src/core/np_random.c) and the token map loader (src/model/engram_map.c), against
 * tests/fixtures/engram/engram_hash.json: numpy's and sympy's own outputs and the indices of
 * the official engram.py semantics, written by tools/ref/engram_ref.py (docs/ENGRAM.md).
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/np_random.h"
#include "model/engram_hash.h"
#include "model/engram_map.h"
#include "test_cases.h"
#include "test_engram.h"

#define FIXTURE "tests/fixtures/engram/engram_hash.json"

json_t *test_engram_fixture(struct test_ctx *t, const char *path, const char *regen)
{
    json_error_t je;
    json_t      *root = json_load_file(path, 0, &je);
    CHECKF(root != NULL, "%s: %s (regenerate: %s)", path, je.text, regen);
    return root;
}

static json_t *load_fixture(struct test_ctx *t)
{
    return test_engram_fixture(t, FIXTURE, "/usr/bin/python3 tools/ref/engram_ref.py");
}

static int64_t jint(json_t *o, const char *key)
{
    return (int64_t)json_integer_value(json_object_get(o, key));
}

static void read_params(json_t *set, struct dsv4_engram_params *p)
{
    json_t *ids = json_object_get(set, "layer_ids"), *rows = json_object_get(set, "num_embeddings");
    memset(p, 0, sizeof(*p));
    p->n_layers = (int)json_array_size(ids);
    for (int l = 0; l < p->n_layers && l < DSV4_ENGRAM_MAX_LAYERS; l++) {
        p->layer_ids[l]      = (int)json_integer_value(json_array_get(ids, (size_t)l));
        p->num_embeddings[l] = (int64_t)json_integer_value(json_array_get(rows, (size_t)l));
    }
    p->max_ngram        = (int)jint(set, "max_ngram_size");
    p->n_heads          = (int)jint(set, "n_heads");
    p->vocab_size       = jint(set, "vocab_size");
    p->compressed_vocab = jint(set, "compressed_vocab_size");
    p->pad_compressed   = (int32_t)jint(set, "pad_compressed");
}

static int64_t jat2(json_t *a, int i, int j)
{
    return (int64_t)json_integer_value(json_array_get(json_array_get(a, (size_t)i), (size_t)j));
}

static void test_pcg64_raw(struct test_ctx *t)
{
    json_t *root = load_fixture(t);
    if (!root) return;
    json_t     *raw = json_object_get(json_object_get(root, "pcg64"), "raw"), *draws;
    const char *seed_s;
    CHECK(json_object_size(raw) >= 3);
    json_object_foreach(raw, seed_s, draws) {
        struct dsv4_pcg64 g;
        dsv4_pcg64_seed(&g, strtoull(seed_s, NULL, 10));
        for (size_t i = 0; i < json_array_size(draws); i++) {
            uint64_t want = strtoull(json_string_value(json_array_get(draws, i)), NULL, 16);
            uint64_t got  = dsv4_pcg64_next(&g);
            CHECKF(got == want, "PCG64(%s) draw %zu: %016" PRIx64 ", numpy %016" PRIx64, seed_s, i,
                   got, want);
        }
    }
    json_decref(root);
}

static void test_pcg64_integers(struct test_ctx *t)
{
    json_t *root = load_fixture(t);
    if (!root) return;
    json_t *cases = json_object_get(json_object_get(root, "pcg64"), "integers"), *c;
    size_t  k;
    CHECK(json_array_size(cases) >= 3);
    json_array_foreach(cases, k, c) {
        json_t           *vals = json_object_get(c, "values");
        int64_t           got[16];
        int               n = (int)json_array_size(vals);
        struct dsv4_pcg64 g;
        dsv4_pcg64_seed(&g, (uint64_t)jint(c, "seed"));
        CHECK(n <= 16 && dsv4_pcg64_integers(&g, 0, jint(c, "high"), got, n) == 0);
        for (int i = 0; i < n && i < 16; i++)
            CHECKF(got[i] == (int64_t)json_integer_value(json_array_get(vals, (size_t)i)),
                   "default_rng(%lld).integers(0, %lld)[%d] = %lld", (long long)jint(c, "seed"),
                   (long long)jint(c, "high"), i, (long long)got[i]);
    }
    /* a range numpy draws with its 32-bit path is refused, not drawn differently */
    struct dsv4_pcg64 g;
    int64_t           v;
    dsv4_pcg64_seed(&g, 0);
    CHECK(dsv4_pcg64_integers(&g, 0, 1000, &v, 1) == DSV4_EUNSUPPORTED);
    CHECK(dsv4_pcg64_integers(&g, 5, 6, &v, 1) == 0 && v == 5);
    json_decref(root);
}

static void test_tables(struct test_ctx *t)
{
    json_t *root = load_fixture(t), *set;
    size_t  k;
    if (!root) return;
    CHECK(json_array_size(json_object_get(root, "sets")) == 3);
    json_array_foreach(json_object_get(root, "sets"), k, set) {
        struct dsv4_engram_params p;
        struct dsv4_engram_hash   h;
        struct dsv4_err           err = { 0 };
        const char               *name = json_string_value(json_object_get(set, "name"));
        read_params(set, &p);
        int rc = dsv4_engram_hash_init(&h, &p, &err);
        CHECKF(rc == 0, "%s: init: %s", name, err.msg);
        if (rc) continue;
        json_t *m = json_object_get(set, "multipliers"), *pr = json_object_get(set, "primes"),
               *off = json_object_get(set, "offsets");
        for (int l = 0; l < p.n_layers; l++) {
            for (int o = 0; o < p.max_ngram; o++)
                CHECKF(h.mult[l][o] == jat2(m, l, o), "%s: multiplier [%d][%d] %lld != %lld",
                       name, l, o, (long long)h.mult[l][o], (long long)jat2(m, l, o));
            for (int c = 0; c < h.n_cols; c++) {
                CHECKF(h.prime[l][c] == jat2(pr, l, c), "%s: prime [%d][%d] %lld != %lld", name,
                       l, c, (long long)h.prime[l][c], (long long)jat2(pr, l, c));
                CHECK(h.offset[l][c] == jat2(off, l, c));
            }
        }
    }
    json_decref(root);
}

/* Indices of every fixture sequence, fed in chunks of `chunk` positions (0: one call). */
static void check_indices(struct test_ctx *t, json_t *set, int chunk)
{
    struct dsv4_engram_params p;
    struct dsv4_engram_hash   h;
    struct dsv4_err           err = { 0 };
    const char               *name = json_string_value(json_object_get(set, "name"));
    json_t                   *seq;
    size_t                    k;
    read_params(set, &p);
    if (dsv4_engram_hash_init(&h, &p, &err)) return;
    const int stride = p.n_layers * h.n_cols;
    json_array_foreach(json_object_get(set, "sequences"), k, seq) {
        json_t  *ids = json_object_get(seq, "ids"), *want = json_object_get(seq, "indices");
        int      n   = (int)json_array_size(ids);
        int32_t *in  = malloc((size_t)n * sizeof(*in));
        int64_t *out = malloc((size_t)n * (size_t)stride * sizeof(*out));
        for (int i = 0; i < n; i++) in[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
        struct dsv4_engram_seq s;
        dsv4_engram_seq_reset(&s);
        int rc = 0;
        if (chunk == 0) rc = dsv4_engram_sequence(&h, in, n, out, &err);
        for (int i = 0; chunk > 0 && i < n && !rc; i += chunk) {
            int len = n - i < chunk ? n - i : chunk;
            rc      = dsv4_engram_chunk(&h, &s, in + i, len, out + (size_t)i * (size_t)stride, &err);
        }
        CHECKF(rc == 0, "%s: %s", name, err.msg);
        for (int i = 0; i < n && !rc; i++)
            for (int l = 0; l < p.n_layers; l++)
                for (int c = 0; c < h.n_cols; c++) {
                    int64_t w = (int64_t)json_integer_value(json_array_get(
                        json_array_get(json_array_get(want, (size_t)i), (size_t)l), (size_t)c));
                    int64_t g = out[(size_t)i * (size_t)stride + (size_t)(l * h.n_cols + c)];
                    CHECKF(g == w, "%s seq %zu chunk %d: pos %d layer %d col %d: %lld, ref %lld",
                           name, k, chunk, i, l, c, (long long)g, (long long)w);
                    CHECK(g >= 0 && g < p.num_embeddings[l]);
                }
        free(in);
        free(out);
    }
}

static void test_indices(struct test_ctx *t)
{
    json_t *root = load_fixture(t), *set;
    size_t  k;
    if (!root) return;
    static const int chunks[] = { 0, 1, 3, 1000 };
    json_array_foreach(json_object_get(root, "sets"), k, set)
        for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) check_indices(t, set, chunks[c]);
    json_decref(root);
}

/* The tiny_a parameters of the fixture, without reading it. */
static void tiny_params(struct dsv4_engram_params *p)
{
    memset(p, 0, sizeof(*p));
    *p = (struct dsv4_engram_params){ .n_layers = 1, .layer_ids = { 3 }, .num_embeddings = { 252 },
                                      .max_ngram = 3, .n_heads = 3, .vocab_size = 10,
                                      .compressed_vocab = 50, .pad_compressed = 1 };
}

static void test_init_errors(struct test_ctx *t)
{
    struct dsv4_engram_params p;
    struct dsv4_engram_hash   h;
    struct dsv4_err           err = { 0 };
    tiny_params(&p);
    CHECKF(dsv4_engram_hash_init(&h, &p, &err) == 0, "%s", err.msg);
    p.num_embeddings[0] = 10;
    CHECK(dsv4_engram_hash_init(&h, &p, &err) == DSV4_EINVAL && strstr(err.msg, "primes need"));
    tiny_params(&p);
    p.max_ngram = 1;
    CHECK(dsv4_engram_hash_init(&h, &p, &err) == DSV4_EINVAL);
    tiny_params(&p);
    p.pad_compressed = 50;
    CHECK(dsv4_engram_hash_init(&h, &p, &err) == DSV4_EINVAL && strstr(err.msg, "pad"));
    tiny_params(&p);
    p.compressed_vocab = (int64_t)1 << 31;
    CHECK(dsv4_engram_hash_init(&h, &p, &err) == DSV4_EUNSUPPORTED);
    tiny_params(&p);
    p.n_heads = DSV4_ENGRAM_MAX_HEADS + 1;
    CHECK(dsv4_engram_hash_init(&h, &p, &err) == DSV4_EUNSUPPORTED);

    /* an id out of range changes nothing: the state still gives the fresh sequence's rows */
    tiny_params(&p);
    CHECK(dsv4_engram_hash_init(&h, &p, &err) == 0);
    struct dsv4_engram_seq s;
    int64_t                a[2 * 6], b[2 * 6];
    const int32_t          bad[2] = { 4, 50 }, good[2] = { 4, 9 };
    dsv4_engram_seq_reset(&s);
    CHECK(dsv4_engram_chunk(&h, &s, bad, 2, a, &err) == DSV4_ERANGE && strstr(err.msg, "50"));
    CHECK(dsv4_engram_chunk(&h, &s, good, 2, a, &err) == 0);
    CHECK(dsv4_engram_sequence(&h, good, 2, b, &err) == 0);
    CHECK(memcmp(a, b, sizeof(a)) == 0);
}

/* Parses text as a map of 4 token ids over 3 compressed ids; returns the code, message in err. */
static int parse_map(const char *text, struct dsv4_err *err, int32_t **m)
{
    int64_t n;
    return dsv4_engram_map_parse(text, "map.json", 4, 3, m, &n, err);
}

static void test_token_map(struct test_ctx *t)
{
    static const struct { const char *text, *msg; } bad[] = {
        { "[0, 1, 2", "not valid JSON" },
        { "{\"a\": 1}", "not a JSON array" },
        { "[]", "empty" },
        { "[0, 1, \"2\", 2]", "element 2 is not an integer" },
        { "[0, 1, 2.0, 2]", "element 2 is not an integer" },
        { "[0, -1, 2, 2]", "element 1 is -1" },
        { "[0, 1, 3, 2]", "element 2 is 3" },
        { "[0, 1, 2]", "3 entries" },
        { "[0, 1, 1, 0]", "largest compressed id is 1" },
    };
    struct dsv4_err err = { 0 };
    int32_t        *m   = NULL;
    CHECKF(parse_map("[0, 2, 1, 2]", &err, &m) == 0, "%s", err.msg);
    CHECK(m && m[0] == 0 && m[1] == 2 && m[2] == 1 && m[3] == 2);
    free(m);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = parse_map(bad[i].text, &err, &m);
        CHECKF(rc == DSV4_EFORMAT && m == NULL && strstr(err.msg, bad[i].msg),
               "map %s: rc %d, \"%s\" (want \"%s\")", bad[i].text, rc, err.msg, bad[i].msg);
    }

    char    path[512];
    int64_t n = 0;
    snprintf(path, sizeof(path), "%s/engram_token_map.json", t->tmpdir);
    CHECK(dsv4_engram_map_load(path, 0, 3, &m, &n, &err) == DSV4_EIO);
    CHECK(test_write_file(path, "[2, 0, 1]\n", 10) == 0);
    CHECKF(dsv4_engram_map_load(path, 0, 3, &m, &n, &err) == 0, "%s", err.msg);
    CHECK(n == 3 && m && m[0] == 2 && m[2] == 1);
    free(m);
}

const struct test_case test_group_engram[] = {
    { "pcg64_raw_matches_numpy", test_pcg64_raw },
    { "pcg64_integers_match_numpy", test_pcg64_integers },
    { "multipliers_primes_offsets", test_tables },
    { "indices_whole_and_chunked", test_indices },
    { "init_and_id_errors", test_init_errors },
    { "token_map_loader", test_token_map },
    { "token_map_from_tokenizer", test_engram_map_tokenizer },
    { "token_map_source", test_engram_map_open },
    { "token_map_bad_tokenizer", test_engram_map_bad_tokenizer },
    { "token_map_deepseek_v3", test_engram_map_deepseek_v3, TEST_NEEDS_NPM_TOKENIZER },
    { "token_map_hf_tokenizers", test_engram_map_hf_tokenizers, TEST_NEEDS_NPM_TOKENIZER },
    { NULL, NULL },
};
