/*
 * engram_map_tok.c - the Engram token map computed from the tokenizer, as the official
 * inference/engram.py build_compressed_token_map computes it with the Hugging Face tokenizers
 * library (engram_map.h). docs/ENGRAM.md ("The token map") writes down each step and where it
 * could differ; tests/unit/test_engram_map.c compares this map with the reference
 * tools/ref/engram_map_ref.py and with the Hugging Face library itself
 * (tests/tokenizer/engram_map_hf.mjs).
 *
 * Per token id, upwards: its ByteLevel decoding (the tokenizer's decode table); a decoding that
 * is not valid UTF-8 or holds U+FFFD is keyed by the token's own spelling, any other by its
 * normalised text (NFKC, NFD, marks dropped, lower case, runs of [ \t\r\n] as one space,
 * White_Space stripped from both ends except a lone space), or by the decoding itself when that
 * is empty.
 * A key seen first gets the next compressed id. Unicode data (normalisation forms, general
 * categories, lower case) comes from utf8proc.
 */
#include "model/engram_map.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/core.h"
#include "tok/tok.h"

/* engram.py's private-use sentinel: a lone space survives Strip as it, then becomes a space */
enum { CP_SENTINEL = 0xE000 };

/* Rust's char::is_whitespace, the White_Space property: what tokenizers' Strip removes. */
static bool is_white_space(utf8proc_int32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* StripAccents drops every General_Category=Mark character (Mn, Mc and Me). */
static bool is_mark(utf8proc_int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

static bool is_collapsed_space(utf8proc_int32_t c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* NFD(NFKC(text[0..len))), text valid UTF-8, as code points into *cps (malloc'd); the count, or
 * a negative utf8proc error. */
static utf8proc_ssize_t nfd_of_nfkc(const char *text, size_t len, utf8proc_int32_t **cps)
{
    utf8proc_uint8_t *nfkc = NULL;
    utf8proc_ssize_t  n    = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len,
                                          &nfkc, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    *cps = NULL;
    if (n < 0) return n;
    const int        nfd = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    utf8proc_ssize_t m   = utf8proc_decompose(nfkc, n, NULL, 0, nfd);
    if (m >= 0) *cps = malloc(((size_t)m + 1) * sizeof(**cps));
    if (m >= 0 && !*cps) m = UTF8PROC_ERROR_NOMEM;
    if (m >= 0) m = utf8proc_decompose(nfkc, n, *cps, m, nfd);
    free(nfkc);
    return m;
}

/* StripAccents, Lowercase and Replace([ \t\r\n]+ -> " ") over c[0..n) in place; the new count.
 * Lower case per character (tokenizers maps each char on its own: no final-sigma rule); the
 * simple mapping, since the one unconditional multi-character lower case (U+0130) decomposes
 * under NFD and loses its mark before it gets here. */
static size_t fold(utf8proc_int32_t *c, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_mark(c[i])) continue;
        utf8proc_int32_t l = utf8proc_tolower(c[i]);
        if (is_collapsed_space(l)) {
            if (o > 0 && c[o - 1] == ' ') continue; /* every space written opened a run */
            l = ' ';
        }
        c[o++] = l;
    }
    return o;
}

/* Appends s[0..n) with each NUL as the bytes C0 80, which valid UTF-8 never holds, so keys
 * stay C strings and stay distinct. */
static void put_text(struct tok_buf *key, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i]) tok_buf_putc(key, s[i]);
        else tok_buf_put(key, "\xC0\x80", 2);
}

/* The sentinel replace, Strip and the replace back, then UTF-8 into key (put_text). */
static void finish(const utf8proc_int32_t *c, size_t n, struct tok_buf *key)
{
    size_t a = 0, b = n;
    if (!(n == 1 && c[0] == ' ')) {
        while (a < b && is_white_space(c[a])) a++;
        while (b > a && is_white_space(c[b - 1])) b--;
    }
    for (size_t i = a; i < b; i++) {
        utf8proc_uint8_t u[4];
        utf8proc_int32_t cp = c[i] == CP_SENTINEL ? ' ' : c[i];
        put_text(key, (const char *)u, (size_t)utf8proc_encode_char(cp, u));
    }
}

static bool has_replacement_char(const char *s, size_t n)
{
    for (size_t i = 0; i + 3 <= n; i++)
        if (memcmp(s + i, "\xEF\xBF\xBD", 3) == 0) return true;
    return false;
}

/* The normalised key of text[0..len) (valid UTF-8) into key; DSV4_ENOMEM or 0. */
static int normalised(const char *text, size_t len, struct tok_buf *key)
{
    utf8proc_int32_t *cps = NULL;
    utf8proc_ssize_t  n   = nfd_of_nfkc(text, len, &cps);
    if (n >= 0) finish(cps, fold(cps, (size_t)n), key);
    free(cps);
    return n < 0 ? DSV4_ENOMEM : 0; /* the text is valid UTF-8: only memory can fail */
}

/* The key of token id into key (emptied first, NUL-terminated); DSV4_ENOMEM or 0. */
static int key_of(const struct dsv4_tokenizer *t, int32_t id, struct tok_buf *key)
{
    const char *text = t->dec_blob + t->dec_off[id];
    size_t      len  = t->dec_off[id + 1] - t->dec_off[id];
    int         rc   = 0;
    key->len         = 0;
    if (!tok_utf8_valid(text, len) || has_replacement_char(text, len))
        tok_buf_puts(key, t->id_str[id]); /* a partial UTF-8 byte token: its raw form */
    else if (!(rc = normalised(text, len, key)) && key->len == 0)
        put_text(key, text, len); /* normalised away: the decoded text itself */
    tok_buf_putc(key, '\0');
    key->len--;
    return rc ? rc : key->oom ? DSV4_ENOMEM : 0;
}

/* dsv4 takes len(tokenizer) as the id range 0 .. n_vocab-1: it is the number of distinct
 * strings of vocab and added tokens, which is that only when no id is missing or shared. */
static int check_ids(const struct dsv4_tokenizer *t, struct dsv4_err *err)
{
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (!t->id_str[id])
            return dsv4_err_set(err, DSV4_EUNSUPPORTED, "engram token map: the tokenizer has no token "
                                "id %d (below its largest, %d), so len(tokenizer) is not its id range",
                                (int)id, (int)t->n_vocab - 1);
    if (t->by_str.len != (size_t)t->n_vocab)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "engram token map: the tokenizer has %zu distinct "
                            "token strings for %d ids, so len(tokenizer) is not its id range",
                            t->by_str.len, (int)t->n_vocab);
    return 0;
}

/* Assigns map[0..n_vocab) (keys interned in arena, key -> id + 1 in keys); *count: ids given. */
static int assign(const struct dsv4_tokenizer *t, struct dsv4_arena *arena, struct dsv4_strmap *keys,
                  int32_t *map, int64_t *count)
{
    struct tok_buf key = { 0 };
    int            rc  = 0;
    *count             = 0;
    for (int32_t id = 0; id < t->n_vocab && !rc; id++) {
        if ((rc = key_of(t, id, &key))) break;
        intptr_t got = (intptr_t)dsv4_strmap_get(keys, key.p);
        if (got) {
            map[id] = (int32_t)(got - 1);
            continue;
        }
        char *s = dsv4_arena_strdup(arena, key.p);
        map[id] = (int32_t)*count;
        if (!s || dsv4_strmap_put(keys, s, (void *)(intptr_t)(++*count), NULL)) rc = DSV4_ENOMEM;
    }
    tok_buf_free(&key);
    return rc;
}

int dsv4_engram_map_from_tokenizer(const dsv4_tokenizer *tok, int64_t compressed_vocab, int32_t **map,
                                   int64_t *n, struct dsv4_err *err)
{
    *map   = NULL;
    *n     = 0;
    int rc = check_ids(tok, err);
    if (rc) return rc;
    struct dsv4_arena  arena;
    struct dsv4_strmap keys;
    int32_t           *m     = malloc((size_t)tok->n_vocab * sizeof(*m));
    int64_t            count = 0;
    dsv4_arena_init(&arena, (size_t)1 << 20);
    rc = !m || dsv4_strmap_init(&keys, (size_t)tok->n_vocab) ? DSV4_ENOMEM : 0;
    if (!rc) {
        rc = assign(tok, &arena, &keys, m, &count);
        dsv4_strmap_free(&keys);
    }
    dsv4_arena_free(&arena);
    if (rc) dsv4_err_set(err, rc, "engram token map: out of memory for %d token ids", (int)tok->n_vocab);
    else if (compressed_vocab > 0 && count != compressed_vocab)
        rc = dsv4_err_set(err, DSV4_EFORMAT, "engram token map: the tokenizer gives %lld compressed ids, "
                          "the config's engram_compressed_vocab_size is %lld (another tokenizer?)",
                          (long long)count, (long long)compressed_vocab);
    if (rc) {
        free(m);
        return rc;
    }
    *map = m;
    *n   = tok->n_vocab;
    return 0;
}
