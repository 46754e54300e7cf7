/*
 * fuzz_tokenizer.c - libFuzzer harness for the tokenizer.json loader (src/tok/tokenizer_load.c)
 * and, for every document that loads, for encode and decode with the tokenizer it built.
 *
 * The input is a whole tokenizer.json document, loaded from memory with
 * dsv4_tokenizer_load_json (what dsv4_tokenizer_load does after mapping the file). A
 * tokenizer that loads then encodes a few short fixed strings (ASCII, the KJV, special-token
 * spellings, digits and spaces for the GPT-2 split, CJK, invalid UTF-8) and the first bytes
 * of the document itself (text shaped by the fuzzer, which reaches the regexes of its own
 * Split steps), plainly and with dsv4_tokenizer_encode_marked (the second half marked
 * literal), decodes the ids whole and through the streaming decoder, and decodes a few
 * ids taken from the input, valid or not. Outputs are not checked: a crash, a sanitizer
 * report, a leak or a hang is the finding.
 *
 * Build: make fuzz (clang) -> build-fuzz/fuzz_tokenizer. Run from the repository root:
 *   mkdir -p build-fuzz/corpus-tokenizer
 *   build-fuzz/fuzz_tokenizer -max_len=16384 -timeout=10 -dict=tests/fuzz/tokenizer.dict \
 *       build-fuzz/corpus-tokenizer tests/fuzz/corpus/tokenizer
 * New inputs go to the first directory; keep those that add coverage with
 *   build-fuzz/fuzz_tokenizer -merge=1 -use_counters=0 tests/fuzz/corpus/tokenizer build-fuzz/corpus-tokenizer
 * and a crasher, once fixed, as tests/fuzz/corpus/tokenizer/crash-<what>.
 * `make test` replays tests/fuzz/corpus/tokenizer without libFuzzer (tests/fuzz/replay_main.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const TEXTS[] = {
    "Hello world",
    "In the beginning God created the heaven and the earth.",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>ok<｜end▁of▁sentence｜>",
    "  1234567 it's   we'll\n\n\t x",
    "中文 日本語 한국어 ÅΩ🙂",
    "\xff\xfe bad \xc3 utf8 \xe2\x82",
    "",
};

static void roundtrip(const dsv4_tokenizer *tok, const char *text, size_t len)
{
    size_t   cap = 3 * len + 2, n = 0;
    int32_t *ids = malloc(cap * sizeof(*ids));
    if (!ids) return;
    struct dsv4_err err;
    if (dsv4_tokenizer_encode(tok, text, len, DSV4_TOKENIZE_BOS, ids, cap, &n, &err) == DSV4_OK) {
        size_t out_cap = 16 * len + 64, out_n = 0;
        char  *out     = malloc(out_cap);
        if (out) dsv4_tokenizer_decode(tok, ids, n, out, out_cap, &out_n, &err);
        free(out);
        /* the streaming decoder, with the buffer size its contract names */
        size_t                       scap = 3 * (dsv4_tokenizer_max_token_bytes(tok) + 3);
        char                        *sbuf = malloc(scap);
        struct dsv4_tokenizer_stream st;
        dsv4_tokenizer_stream_init(&st);
        for (size_t i = 0; sbuf && i < n; i++) dsv4_tokenizer_stream_push(tok, &st, ids[i], sbuf, scap, &out_n, &err);
        if (sbuf) dsv4_tokenizer_stream_flush(&st, sbuf, &out_n);
        free(sbuf);
        for (size_t i = 0; i < n && i < 8; i++) {
            dsv4_tokenizer_token_str(tok, ids[i]);
            dsv4_tokenizer_is_special(tok, ids[i]);
        }
    }
    /* a buffer too small: the call must stop at cap */
    if (len) dsv4_tokenizer_encode(tok, text, len, 0, ids, 1, &n, &err);
    /* the marked variant (user text as literal characters), marks on the second half; it
     * refuses invalid UTF-8 */
    uint8_t *lit = malloc(len ? len : 1);
    if (lit) {
        for (size_t i = 0; i < len; i++) lit[i] = i >= len / 2;
        dsv4_tokenizer_encode_marked(tok, text, len, lit, 0, ids, cap, &n, &err);
    }
    free(lit);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsv4_tokenizer *tok;
    struct dsv4_err err;
    if (dsv4_tokenizer_load_json(&tok, (const char *)data, size, "fuzz.json", &err) != DSV4_OK) return 0;
    for (size_t i = 0; i < sizeof(TEXTS) / sizeof(TEXTS[0]); i++) roundtrip(tok, TEXTS[i], strlen(TEXTS[i]));
    roundtrip(tok, (const char *)data, size < 64 ? size : 64);

    /* ids from the input: in range, out of range, negative */
    int32_t ids[4];
    int32_t nv = dsv4_tokenizer_n_vocab(tok);
    for (int i = 0; i < 4; i++) {
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) v = v << 8 | (size > (size_t)(4 * i + k) ? data[4 * i + k] : 0);
        ids[i] = i == 0 ? (int32_t)(v % (uint32_t)nv) : (int32_t)v;
    }
    char   out[256];
    size_t n;
    dsv4_tokenizer_decode(tok, ids, 4, out, sizeof(out), &n, &err);
    dsv4_tokenizer_decode(tok, ids, 1, out, sizeof(out), &n, &err);
    int32_t id;
    dsv4_tokenizer_token_id(tok, "<｜end▁of▁sentence｜>", &id, &err);
    dsv4_tokenizer_token_id(tok, "Ġthe", &id, &err);
    dsv4_tokenizer_free(tok);
    return 0;
}
