/*
 * test_safetensors.c - the strict safetensors parser against malformed headers, the
 * streaming writer round trip, sharded checkpoints (index, missing shard), and a bounded
 * mutation run over a valid file (no crash, no leak under the sanitizer build).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "test_cases.h"

/* Builds a file: 8-byte length, header, then data_len bytes of 0x5a. Returns malloc'd buf. */
static uint8_t *make_file(const char *header, size_t data_len, size_t *size)
{
    size_t   hl = strlen(header);
    uint8_t *b  = malloc(8 + hl + data_len + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, 0x5a, data_len);
    *size = 8 + hl + data_len;
    return b;
}

static int parse_buf(const uint8_t *b, size_t n, struct dsv4_err *err, size_t *count)
{
    struct dsv4_arena   a;
    struct dsv4_tensor *ts;
    size_t              nt = 0;
    dsv4_arena_init(&a, 4096);
    int rc = dsv4_st_parse(b, n, "t.safetensors", &a, &ts, &nt, err);
    dsv4_arena_free(&a);
    if (count) *count = nt;
    return rc;
}

/* Parses header+data and expects failure with msg containing `want`. */
static void expect_bad(struct test_ctx *t, const char *header, size_t data_len, const char *want)
{
    size_t          n;
    uint8_t        *b = make_file(header, data_len, &n);
    struct dsv4_err err;
    int             rc = parse_buf(b, n, &err, NULL);
    CHECKF(rc == DSV4_EFORMAT, "header %.60s: expected failure, got %d", header, rc);
    if (rc == DSV4_EFORMAT) {
        CHECKF(strstr(err.msg, want) != NULL, "header %.60s: message '%s' lacks '%s'", header, err.msg, want);
        CHECKF(strstr(err.msg, "byte ") != NULL, "message without byte offset: %s", err.msg);
    }
    free(b);
}

static void test_valid_all_dtypes(struct test_ctx *t)
{
    const char *names[] = { "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0" };
    const int   sizes[] = { 8, 4, 2, 2, 8, 4, 2, 1, 1, 1, 1, 1, 1 };
    char        h[4096];
    size_t      k = 0, off = 0;
    k += (size_t)snprintf(h + k, sizeof(h) - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < 13; i++) {
        size_t nb = (size_t)sizes[i] * 6;
        k += (size_t)snprintf(h + k, sizeof(h) - k, ",\"t_%s\":{\"dtype\":\"%s\",\"shape\":[2,3],\"data_offsets\":[%zu,%zu]}",
                              names[i], names[i], off, off + nb);
        off += nb;
    }
    k += (size_t)snprintf(h + k, sizeof(h) - k, ",\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[%zu,%zu]}}  ", off, off);
    size_t          n, count;
    uint8_t        *b = make_file(h, off, &n);
    struct dsv4_err err;
    int             rc = parse_buf(b, n, &err, &count);
    CHECKF(rc == DSV4_OK, "valid file rejected: %s", err.msg);
    CHECK(count == 14);
    free(b);
}

static void test_malformed_headers(struct test_ctx *t)
{
    const char *ok1 = "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    char        h[512];
    /* file shorter than the length prefix */
    {
        uint8_t         b[5] = { 1, 0, 0, 0, 0 };
        struct dsv4_err err;
        CHECK(parse_buf(b, 5, &err, NULL) == DSV4_EFORMAT);
        CHECK(strstr(err.msg, "too short") != NULL);
    }
    /* header length larger than the file */
    {
        size_t   n;
        uint8_t *b = make_file("{}", 0, &n);
        b[0]       = 200;
        struct dsv4_err err;
        CHECK(parse_buf(b, n, &err, NULL) == DSV4_EFORMAT);
        CHECK(strstr(err.msg, "past the end") != NULL);
        b[0] = 0;
        CHECK(parse_buf(b, n, &err, NULL) == DSV4_EFORMAT); /* zero length */
        memset(b, 0xff, 8);
        CHECK(parse_buf(b, n, &err, NULL) == DSV4_EFORMAT); /* absurd length */
        free(b);
    }
    expect_bad(t, "{\"a\":", 0, "not valid JSON");
    expect_bad(t, "[1,2,3]", 0, "not a JSON object");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{}}", 8, "not valid JSON");
    expect_bad(t, "{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "shape");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "non-negative");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, "non-negative");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "end before begin");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "outside the data area");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "byte size");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, "unknown field");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflows");
    snprintf(h, sizeof(h), "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", ok1);
    expect_bad(t, h, 12, "overlaps");
    snprintf(h, sizeof(h), "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}", ok1);
    expect_bad(t, h, 16, "hole");
    snprintf(h, sizeof(h), "{%s}", ok1);
    expect_bad(t, h, 12, "trailing bytes");
    expect_bad(t, "{\"__metadata__\":{\"k\":3}}", 0, "not a string");
    expect_bad(t, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "8 dimensions");
    /* invalid UTF-8 inside a key */
    expect_bad(t, "{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "not valid JSON");
    /* deeply nested JSON must fail cleanly, not overflow the stack */
    {
        size_t depth = 100000;
        char  *deep  = malloc(depth * 2 + 16);
        size_t k     = 0;
        deep[k++]    = '{';
        deep[k++]    = '"';
        deep[k++]    = 'a';
        deep[k++]    = '"';
        deep[k++]    = ':';
        for (size_t i = 0; i < depth; i++) deep[k++] = '[';
        for (size_t i = 0; i < depth; i++) deep[k++] = ']';
        deep[k++] = '}';
        deep[k]   = 0;
        expect_bad(t, deep, 0, "not valid JSON");
        free(deep);
    }
}

static void test_writer_roundtrip(struct test_ctx *t)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/rt.safetensors", t->tmpdir);
    struct dsv4_st_writer *w = NULL;
    struct dsv4_err        err;
    if (dsv4_st_writer_open(&w, path, &err)) { /* no writer to write with */
        CHECKF(0, "%s", err.msg);
        return;
    }
    int64_t s1[2] = { 3, 5 }, s2[1] = { 7 };
    CHECK(dsv4_st_writer_add(w, "x", DSV4_DTYPE_F32, 2, s1, &err) == DSV4_OK);
    CHECK(dsv4_st_writer_add(w, "y", DSV4_DTYPE_BF16, 1, s2, &err) == DSV4_OK);
    CHECK(dsv4_st_writer_add(w, "x", DSV4_DTYPE_BF16, 1, s2, &err) == DSV4_EINVAL);
    CHECK(dsv4_st_writer_set_metadata(w, "format", "pt") == DSV4_OK);
    float    xs[15];
    uint16_t ys[7];
    for (int i = 0; i < 15; i++) xs[i] = (float)i * 0.5f;
    for (int i = 0; i < 7; i++) ys[i] = (uint16_t)(i * 3);
    CHECK(dsv4_st_writer_write(w, xs, 20, &err) == DSV4_OK);
    CHECK(dsv4_st_writer_write(w, (char *)xs + 20, 40, &err) == DSV4_OK);
    CHECK(dsv4_st_writer_write(w, ys, 14, &err) == DSV4_OK);
    CHECK(dsv4_st_writer_close(w, &err) == DSV4_OK);

    struct dsv4_checkpoint ck;
    CHECKF(dsv4_checkpoint_open(&ck, path, &err) == DSV4_OK, "%s", err.msg);
    const struct dsv4_tensor *x = dsv4_checkpoint_find(&ck, "x"), *y = dsv4_checkpoint_find(&ck, "y");
    CHECK(x && y && ck.n_tensors == 2);
    if (x && y) {
        CHECK(x->dtype == DSV4_DTYPE_F32 && x->ndim == 2 && x->shape[0] == 3 && x->shape[1] == 5);
        CHECK(memcmp(x->data, xs, 60) == 0 && memcmp(y->data, ys, 14) == 0);
        CHECK(((uintptr_t)x->offset % 8) == 0); /* header padded to 8 */
    }
    dsv4_checkpoint_close(&ck);

    /* short write is an error at close */
    if (dsv4_st_writer_open(&w, path, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    CHECK(dsv4_st_writer_add(w, "x", DSV4_DTYPE_F32, 2, s1, &err) == DSV4_OK);
    CHECK(dsv4_st_writer_write(w, xs, 8, &err) == DSV4_OK);
    CHECK(dsv4_st_writer_write(w, xs, 60, &err) == DSV4_EINVAL);
    CHECK(dsv4_st_writer_close(w, &err) == DSV4_EINVAL);
}

/* A small valid file mutated many times: every mutant must parse or fail cleanly. */
static void test_mutations(struct test_ctx *t)
{
    const char *h = "{\"__metadata__\":{\"a\":\"b\"},\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                    "\"s\":{\"dtype\":\"F8_E8M0\",\"shape\":[1],\"data_offsets\":[12,13]}}";
    size_t             n;
    uint8_t           *orig = make_file(h, 13, &n);
    uint8_t           *b    = malloc(n + 64);
    unsigned long long s    = 1234;
    int                ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(b, orig, n);
        size_t m    = n;
        int    nmut = 1 + (int)(test_rand_u64(&s) % 4);
        for (int k = 0; k < nmut; k++) {
            size_t pos = (size_t)(test_rand_u64(&s) % m);
            switch (test_rand_u64(&s) % 4) {
            case 0: b[pos] = (uint8_t)test_rand_u64(&s); break;
            case 1: b[pos] ^= (uint8_t)(1u << (test_rand_u64(&s) % 8)); break;
            case 2: m = pos + 1; break; /* truncate */
            case 3: b[pos] = (uint8_t)"{}[]\",:0123456789-"[test_rand_u64(&s) % 18]; break;
            }
        }
        struct dsv4_err err;
        if (parse_buf(b, m, &err, NULL) == DSV4_OK) ok++;
        else bad++;
    }
    CHECK(ok + bad == 20000);
    CHECK(bad > 1000); /* the mutator really produced broken inputs */
    free(b);
    free(orig);
}

/* Replays the fuzz corpus (tests/fuzz/corpus/safetensors): crashes only. */
static void test_fuzz_corpus(struct test_ctx *t)
{
    char *list = NULL;
    int   rc   = test_run("ls tests/fuzz/corpus/safetensors/* 2>/dev/null", &list);
    (void)rc;
    int files = 0;
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
        size_t n;
        void  *data = test_read_file(line, &n);
        if (!data) continue;
        struct dsv4_err err;
        parse_buf(data, n, &err, NULL);
        free(data);
        files++;
    }
    free(list);
    CHECKF(files >= 5, "fuzz corpus has %d files", files);
}

const struct test_case test_group_safetensors[] = {
    { "valid_file_all_dtypes", test_valid_all_dtypes },
    { "malformed_headers", test_malformed_headers },
    { "writer_roundtrip", test_writer_roundtrip },
    { "mutations_fail_cleanly", test_mutations },
    { "fuzz_corpus_replay", test_fuzz_corpus },
    { NULL, NULL },
};
