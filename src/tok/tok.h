/*
 * tok.h - internals of the tokenizer and of the chat format (src/tok/).
 *
 *   tokenizer_load.c  tokenizer.json -> struct dsv4_tokenizer (validation, tables, regexes)
 *   tokenizer.c       encode (added tokens, pre-tokenizer splits, BPE) and decode
 *   text.c            UTF-8 (validation, repair, the streaming decoder) and byte buffers
 *   pyjson.c          JSON text written the way Python's json.dumps writes it
 *   chat.c            messages -> the DeepSeek-V4 prompt string
 *   dsml.c            generated text -> reasoning, content and tool calls
 *
 * The tokenizer is immutable after load (every table lives in its arena), so encode and
 * decode take it const and may run on many threads; per-call scratch lives in the call.
 */
#ifndef DSV4_TOK_H
#define DSV4_TOK_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* ------------------------------------------------------------------ tokenizer tables */

/* The split behaviours of the Hugging Face Split pre-tokenizer (and of Regex patterns). */
enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};

struct tok_split {
    void                   *regex;    /* OnigRegex (kept opaque here to keep onig out of users) */
    enum tok_split_behavior behavior;
    bool                    invert;
};

/* A byte trie over the added tokens, for leftmost-longest matching. Children of a node form
 * a singly linked list (first_child / next_sibling); the tries hold hundreds of tokens, so a
 * list walk beats a 256-wide table in memory and is as fast in practice. */
struct tok_trie_node {
    int32_t first_child;  /* -1 when none */
    int32_t next_sibling; /* -1 when none */
    int32_t token_id;     /* -1 unless a token ends here */
    uint8_t byte;
};

struct tok_trie {
    struct tok_trie_node *nodes; /* nodes[0] is the root */
    int32_t               n_nodes;
    bool                  first_byte[256]; /* bytes that start some token */
};

/* Merge table: (left id, right id) -> (rank, merged id), open addressing on the packed pair. */
struct tok_merge {
    uint64_t pair; /* left << 32 | right; TOK_MERGE_EMPTY for a free slot */
    int32_t  rank;
    int32_t  id;
};

#define TOK_MERGE_EMPTY UINT64_MAX

enum tok_id_flags {
    TOK_ID_VOCAB   = 1u << 0, /* in model.vocab */
    TOK_ID_ADDED   = 1u << 1, /* in added_tokens */
    TOK_ID_SPECIAL = 1u << 2, /* added with "special": true */
};

struct dsv4_tokenizer {
    struct dsv4_arena arena; /* every table below */

    int32_t      n_vocab;  /* max id + 1 */
    const char **id_str;   /* [n_vocab] tokenizer.json spelling, NULL for unused ids */
    uint8_t     *id_flags; /* [n_vocab] enum tok_id_flags */
    uint32_t    *dec_off;  /* [n_vocab + 1] decoded bytes of id i: dec_blob[dec_off[i]..[i+1]) */
    char        *dec_blob;
    size_t       max_token_bytes;

    struct dsv4_strmap by_str;    /* spelling -> id + 1 (added tokens take precedence) */
    struct dsv4_strmap vocab_str; /* model.vocab only: spelling -> id + 1 (ignore_merges) */

    /* BPE */
    int32_t           byte_id[256]; /* id of the byte-level symbol of each byte */
    struct tok_merge *merges;
    size_t            merge_mask;   /* capacity - 1 (a power of two) */
    bool              ignore_merges;

    /* pre-tokenizer: Split steps (ByteLevel's own regex included) before the byte mapping */
    struct tok_split *splits;
    int               n_splits;

    /* added tokens: first those matched on raw text, then the "normalized" ones */
    struct tok_trie trie_raw;
    struct tok_trie trie_norm;
    int             n_added;

    int32_t bos, eos;
};

/* tokenizer_load.c: the byte-level alphabet of GPT-2 (byte -> code point) */
uint32_t tok_byte_to_cp(uint8_t b);
/* ... and its inverse: the byte of a code point, or -1 when cp is not in the alphabet */
int      tok_cp_to_byte(uint32_t cp);

/* tokenizer_load.c: compiles an Oniguruma regex for a Split step */
int  tok_regex_compile(void **out, const char *pattern, size_t len, bool literal, const char *where,
                       struct dsv4_err *err);
void tok_regex_free(void *regex);

/* ------------------------------------------------------------------ UTF-8 (text.c) */

/* Length of the maximal valid prefix of a UTF-8 sequence starting at s[0..n), 0 when s[0]
 * cannot start one, and the full length of the character in *full (0 if s[0] is invalid).
 * A return < *full means the character is invalid or incomplete within n bytes. */
size_t tok_utf8_prefix(const unsigned char *s, size_t n, size_t *full);
/* True when s[0..n) is valid UTF-8. */
bool   tok_utf8_valid(const char *s, size_t n);
/* Copies s[0..n) to out replacing each maximal invalid subpart by U+FFFD; out must hold 3n
 * bytes. Returns the bytes written. */
size_t tok_utf8_repair(const char *s, size_t n, char *out);
/* Decodes one code point at s (which must be valid UTF-8); *len receives its length. */
uint32_t tok_utf8_decode(const unsigned char *s, size_t *len);
/* Encodes cp into out (4 bytes room); returns the length. */
size_t   tok_utf8_encode(uint32_t cp, char *out);

/* ------------------------------------------------------------------ growable string (text.c) */

/* A byte buffer that grows by doubling; on allocation failure it sets oom and stops growing,
 * so callers test once at the end (a sticky error, as the parsers' cursors). */
struct tok_buf {
    char  *p;
    size_t len;
    size_t cap;
    bool   oom;
};

void tok_buf_put(struct tok_buf *b, const void *s, size_t n);
void tok_buf_puts(struct tok_buf *b, const char *s);
void tok_buf_putc(struct tok_buf *b, char c);
void tok_buf_free(struct tok_buf *b);
/* NUL-terminates and hands the buffer over (NULL after oom). */
char *tok_buf_take(struct tok_buf *b, size_t *len);

/* ------------------------------------------------------------------ Python-style JSON (pyjson.c) */

/* Appends json.dumps(v, ensure_ascii=False) as Python writes it (", " and ": " separators,
 * shortest round-trip floats, key order kept). DSV4_EINVAL for a value Python cannot hold
 * (a NaN from a caller-built value). */
int tok_pyjson_dump(struct tok_buf *b, const json_t *v, struct dsv4_err *err);
/* Appends a string as a JSON string literal (json.dumps of a str). */
void tok_pyjson_string(struct tok_buf *b, const char *s, size_t n);

#endif /* DSV4_TOK_H */
