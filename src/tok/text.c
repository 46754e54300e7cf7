/*
 * text.c - the text primitives of src/tok: UTF-8 validation and repair, the streaming
 * token decoder, and the growable byte buffer the chat code writes into.
 *
 * UTF-8 policy, the same everywhere in dsv4: a byte sequence is valid when it follows
 * Table 3-7 of the Unicode standard (no overlongs, no surrogates, nothing past U+10FFFF).
 * Invalid input is repaired by replacing each *maximal subpart* (the longest prefix of a
 * well-formed sequence that is still a prefix, or else one byte) with U+FFFD. That is the
 * Unicode recommendation, and what Python's errors="replace", Rust's from_utf8_lossy and
 * the WHATWG TextDecoder all do, so text repaired here matches the reference stack.
 */
#include <stdlib.h>
#include <string.h>

#include "tok/tok.h"

static const char REPLACEMENT[3] = { (char)0xEF, (char)0xBF, (char)0xBD }; /* U+FFFD */

/* ------------------------------------------------------------------ UTF-8 */

/* Bytes of the sequence that lead byte c starts (0: c cannot start one) and the allowed
 * range of its second byte (narrower than 80..BF after E0, ED, F0 and F4). */
static unsigned seq_len(unsigned c, unsigned *lo, unsigned *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c == 0xE0) {
        *lo = 0xA0;
        return 3;
    }
    if (c >= 0xE1 && c <= 0xEC) return 3;
    if (c == 0xED) {
        *hi = 0x9F;
        return 3;
    }
    if (c >= 0xEE && c <= 0xEF) return 3;
    if (c == 0xF0) {
        *lo = 0x90;
        return 4;
    }
    if (c >= 0xF1 && c <= 0xF3) return 4;
    if (c == 0xF4) {
        *hi = 0x8F;
        return 4;
    }
    return 0;
}

size_t tok_utf8_prefix(const unsigned char *s, size_t n, size_t *full)
{
    unsigned lo, hi;
    size_t   need = seq_len(s[0], &lo, &hi);
    *full         = need;
    if (need <= 1) return need;
    if (n < 2 || s[1] < lo || s[1] > hi) return 1;
    size_t i = 2;
    while (i < need && i < n && (s[i] & 0xC0) == 0x80) i++;
    return i;
}

bool tok_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t               i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t full, p = tok_utf8_prefix(s + i, n - i, &full);
        if (full == 0 || p != full) return false;
        i += p;
    }
    return true;
}

size_t tok_utf8_repair(const char *str, size_t n, char *out)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t               i = 0, o = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            out[o++] = (char)s[i++];
            continue;
        }
        size_t full, p = tok_utf8_prefix(s + i, n - i, &full);
        if (full != 0 && p == full) {
            memcpy(out + o, s + i, p);
            o += p;
            i += p;
        } else {
            memcpy(out + o, REPLACEMENT, 3);
            o += 3;
            i += p ? p : 1;
        }
    }
    return o;
}

uint32_t tok_utf8_decode(const unsigned char *s, size_t *len)
{
    if (s[0] < 0x80) {
        *len = 1;
        return s[0];
    }
    if (s[0] < 0xE0) {
        *len = 2;
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (s[0] < 0xF0) {
        *len = 3;
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

size_t tok_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ------------------------------------------------------------------ streaming decoder */

/*
 * The stream keeps a valid prefix of at most three bytes of an incomplete character. Each
 * new byte either extends it (and completes it: emit), or proves it invalid: the prefix is
 * then a maximal subpart and becomes one U+FFFD, and the byte starts afresh. This is the
 * byte-at-a-time form of tok_utf8_repair, so the concatenated output of a stream equals
 * the repair of the concatenated token bytes.
 */
void dsv4_tokenizer_stream_init(struct dsv4_tokenizer_stream *st)
{
    memset(st, 0, sizeof(*st));
}

static size_t stream_byte(struct dsv4_tokenizer_stream *st, unsigned char c, char *out)
{
    size_t   o = 0;
    unsigned lo, hi;
    if (st->n_pending > 0) {
        unsigned need = (unsigned)seq_len(st->pending[0], &lo, &hi);
        if (st->n_pending > 1) {
            lo = 0x80;
            hi = 0xBF;
        }
        if (c >= lo && c <= hi) {
            st->pending[st->n_pending++] = c;
            if (st->n_pending < need) return 0;
            memcpy(out, st->pending, need);
            st->n_pending = 0;
            return need;
        }
        memcpy(out, REPLACEMENT, 3);
        o             = 3;
        st->n_pending = 0;
    }
    unsigned need = (unsigned)seq_len(c, &lo, &hi);
    if (need == 1) {
        out[o++] = (char)c;
    } else if (need == 0) {
        memcpy(out + o, REPLACEMENT, 3);
        o += 3;
    } else {
        st->pending[0] = c;
        st->n_pending  = 1;
    }
    return o;
}

int dsv4_tokenizer_stream_push(const dsv4_tokenizer *tok, struct dsv4_tokenizer_stream *st,
                               int32_t id, char *out, size_t cap, size_t *n_out,
                               struct dsv4_err *err)
{
    *n_out = 0;
    if (id < 0 || id >= tok->n_vocab || !tok->id_str[id])
        return dsv4_err_set(err, DSV4_ERANGE, "token id %d is not in the vocabulary (%d ids)", (int)id,
                            (int)tok->n_vocab);
    const unsigned char *b = (const unsigned char *)tok->dec_blob + tok->dec_off[id];
    size_t               n = tok->dec_off[id + 1] - tok->dec_off[id];
    if (cap < 3 * (n + st->n_pending))
        return dsv4_err_set(err, DSV4_ERANGE, "stream output buffer of %zu bytes is too small for token %d",
                            cap, (int)id);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (st->n_pending == 0 && b[i] < 0x80) {
            out[o++] = (char)b[i];
            continue;
        }
        o += stream_byte(st, b[i], out + o);
    }
    *n_out = o;
    return DSV4_OK;
}

void dsv4_tokenizer_stream_flush(struct dsv4_tokenizer_stream *st, char *out, size_t *n_out)
{
    *n_out = 0;
    if (st->n_pending) {
        memcpy(out, REPLACEMENT, 3);
        *n_out = 3;
    }
    st->n_pending = 0;
}

/* ------------------------------------------------------------------ byte buffer */

static bool buf_reserve(struct tok_buf *b, size_t extra)
{
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            b->oom = true;
            return false;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p   = p;
    b->cap = cap;
    return true;
}

void tok_buf_put(struct tok_buf *b, const void *s, size_t n)
{
    if (n == 0 || !buf_reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

void tok_buf_puts(struct tok_buf *b, const char *s)
{
    tok_buf_put(b, s, strlen(s));
}

void tok_buf_putc(struct tok_buf *b, char c)
{
    tok_buf_put(b, &c, 1);
}

void tok_buf_free(struct tok_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

char *tok_buf_take(struct tok_buf *b, size_t *len)
{
    if (!buf_reserve(b, 0)) {
        tok_buf_free(b);
        return NULL;
    }
    b->p[b->len] = '\0';
    char *p      = b->p;
    if (len) *len = b->len;
    memset(b, 0, sizeof(*b));
    return p;
}
