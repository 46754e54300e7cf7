/*
 * fuzz_chat.c - libFuzzer harness for the chat format: the DSML parser of generated text
 * (src/tok/dsml.c) and the renderer of JSON messages (src/tok/chat.c).
 *
 * Each input is used three ways:
 *   1. as a generated assistant turn, parsed whole by dsv4_chat_parse in chat and in
 *      thinking mode;
 *   2. as the same text fed to the streaming parser in chunks of 1 to 16 bytes (sizes
 *      drawn from a generator seeded by the input, so a replay repeats them), in both
 *      modes. Where the whole parse succeeds, the stream must succeed too and report the
 *      same reasoning, content and tool calls: the streaming parser holds back only text
 *      that may still start a marker, so chunking must never change the result. A
 *      difference aborts (a finding like a crash);
 *   3. as a JSON messages document (an array of messages or {"messages", "tools"}) for
 *      dsv4_chat_render_json, under four parameter sets (chat, thinking, thinking with
 *      the "max" effort prefix and kept reasoning, no BOS), two of them through
 *      dsv4_chat_render_json_marked (the prompt plus a literal mark per byte, as the
 *      server renders). Inputs that are not JSON fail in the JSON parser at once.
 *
 * Build: make fuzz (clang) -> build-fuzz/fuzz_chat. Run from the repository root:
 *   mkdir -p build-fuzz/corpus-chat
 *   build-fuzz/fuzz_chat -max_len=8192 -timeout=10 -dict=tests/fuzz/chat.dict \
 *       build-fuzz/corpus-chat tests/fuzz/corpus/chat
 * New inputs go to the first directory; keep those that add coverage with
 *   build-fuzz/fuzz_chat -merge=1 -use_counters=0 tests/fuzz/corpus/chat build-fuzz/corpus-chat
 * and a crasher, once fixed, as tests/fuzz/corpus/chat/crash-<what>.
 * `make test` replays tests/fuzz/corpus/chat without libFuzzer (tests/fuzz/replay_main.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What the streaming parser reported, gathered as dsv4_chat_parse gathers it. */
struct gathered {
    char  *text[2]; /* [0] reasoning, [1] content */
    size_t len[2], cap[2];
    char  *calls;   /* each call as name NUL arguments NUL */
    size_t calls_len, calls_cap;
    size_t n_calls;
    bool   oom;
};

static void put(char **p, size_t *len, size_t *cap, bool *oom, const void *s, size_t n)
{
    if (*oom) return;
    if (*len + n > *cap) {
        size_t nc = *cap ? *cap : 64;
        while (nc < *len + n) nc *= 2;
        char *np = realloc(*p, nc);
        if (!np) {
            *oom = true;
            return;
        }
        *p   = np;
        *cap = nc;
    }
    if (n) memcpy(*p + *len, s, n);
    *len += n;
}

static void on_event(void *ud, const struct dsv4_chat_event *ev)
{
    struct gathered *g = ud;
    if (ev->kind == DSV4_CHAT_EVENT_TOOL_CALL) {
        if (ev->index != g->n_calls) abort(); /* calls are numbered in order, from 0 */
        put(&g->calls, &g->calls_len, &g->calls_cap, &g->oom, ev->name, strlen(ev->name) + 1);
        put(&g->calls, &g->calls_len, &g->calls_cap, &g->oom, ev->arguments, strlen(ev->arguments) + 1);
        g->n_calls++;
        return;
    }
    int k = ev->kind == DSV4_CHAT_EVENT_CONTENT;
    if (ev->len == 0) abort(); /* deltas are never empty */
    put(&g->text[k], &g->len[k], &g->cap[k], &g->oom, ev->text, ev->len);
}

static void gathered_free(struct gathered *g)
{
    free(g->text[0]);
    free(g->text[1]);
    free(g->calls);
}

static bool same(const char *a, size_t an, const char *b, size_t bn)
{
    return an == bn && (an == 0 || memcmp(a, b, an) == 0);
}

/* The whole parse against the chunked stream (point 2 of the header). */
static void parse_both(const char *text, size_t size, enum dsv4_chat_mode mode, uint64_t seed)
{
    struct dsv4_chat_parsed p;
    struct dsv4_err         err;
    int                     whole = dsv4_chat_parse(text, size, mode, &p, &err);

    struct gathered   g = { 0 };
    dsv4_chat_stream *s;
    if (dsv4_chat_stream_init(&s, mode, on_event, &g, &err) != DSV4_OK) abort();
    int    rc  = DSV4_OK;
    size_t off = 0;
    while (off < size && rc == DSV4_OK) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = 1 + (size_t)(seed >> 60); /* 1..16 bytes */
        if (n > size - off) n = size - off;
        rc = dsv4_chat_stream_feed(s, text + off, n, &err);
        off += n;
    }
    /* a failed stream stays failed */
    if (rc != DSV4_OK && dsv4_chat_stream_feed(s, "x", 1, &err) == DSV4_OK) abort();
    struct dsv4_chat_stream_end end;
    if (rc == DSV4_OK) rc = dsv4_chat_stream_finish(s, &end, &err);
    dsv4_chat_stream_free(s);

    if (whole == DSV4_OK && !g.oom) {
        if (rc != DSV4_OK) {
            fprintf(stderr, "fuzz_chat: the whole parse succeeds, the chunked stream fails: %s\n", err.msg);
            abort();
        }
        bool ok = same(p.reasoning, p.reasoning_len, g.text[0], g.len[0]) &&
                  same(p.content, p.content_len, g.text[1], g.len[1]) && p.n_calls == g.n_calls &&
                  p.n_calls == end.n_calls;
        size_t o = 0;
        for (size_t i = 0; ok && i < p.n_calls; i++) {
            size_t nl = strlen(p.calls[i].name) + 1, al = strlen(p.calls[i].arguments) + 1;
            ok = o + nl + al <= g.calls_len && memcmp(g.calls + o, p.calls[i].name, nl) == 0 &&
                 memcmp(g.calls + o + nl, p.calls[i].arguments, al) == 0;
            o += nl + al;
        }
        if (!ok) {
            fprintf(stderr, "fuzz_chat: the chunked stream differs from the whole parse (mode %d)\n", (int)mode);
            abort();
        }
    }
    if (whole == DSV4_OK) dsv4_chat_parsed_free(&p);
    gathered_free(&g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    uint64_t    seed = 0x9e3779b97f4a7c15ull ^ size;
    for (size_t i = 0; i < size; i++) seed = (seed ^ data[i]) * 0x100000001b3ull;
    parse_both(text, size, DSV4_CHAT_MODE_CHAT, seed);
    parse_both(text, size, DSV4_CHAT_MODE_THINKING, seed);

    for (int v = 0; v < 4; v++) {
        struct dsv4_chat_params cp;
        dsv4_chat_params_default(&cp);
        cp.mode = v == 0 ? DSV4_CHAT_MODE_CHAT : DSV4_CHAT_MODE_THINKING;
        if (v == 2) {
            cp.effort         = DSV4_CHAT_EFFORT_MAX;
            cp.keep_reasoning = true;
        }
        cp.no_bos = v == 3;
        char           *out = NULL;
        size_t          n   = 0;
        struct dsv4_err err;
        uint8_t        *lit = NULL;
        /* odd sets through the marked variant: the same prompt plus a mark per byte */
        int rc = v & 1 ? dsv4_chat_render_json_marked(text, size, &cp, &out, &n, &lit, &err)
                       : dsv4_chat_render_json(text, size, &cp, &out, &n, &err);
        if (rc == DSV4_OK && lit && n && lit[n - 1] > 1) abort(); /* marks are 0 or 1, n of them */
        free(lit);
        free(out);
    }
    return 0;
}
