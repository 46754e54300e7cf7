/*
 * test_session_file.c - saved sessions (dsv4_session_save/load, src/engine/session_file.c).
 *
 * resume_bit_exact: on tiny-a and tiny-b (MTP state on), a session A evaluates a prompt and
 * is saved; a fresh session B loads the file (tokens and last logits as saved); then A and B
 * evaluate the same continuation one token at a time, and a cold session C evaluates prompt
 * and continuation at once: B's logits equal A's and C's bit for bit at every step. Saves
 * inside the first window, at a page boundary (256) and past a ratio-128 block.
 * bad_files: a truncated file, a flipped payload byte, a flipped header byte, another
 * version, another model's file (tiny-b's into tiny-a), a missing file: each a clear
 * DSV4_E* error and the session left reset.
 * chat_resume: `dsv4 chat --save` after one turn, then `--load` in a new process: it says it
 * resumed and its greedy reply to the second turn is the one a single process gives.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/session.h"
#include "kv/kv_disk.h"
#include "support/gen.h"
#include "test_cases.h"
#include "test_session.h"

enum { CONT = 6, MAX_CTX = 300 };

dsv4_engine *test_session_model(struct test_ctx *t, const char *preset)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/%s", t->tmpdir, preset);
    struct gen_opts o;
    gen_opts_default(&o);
    o.preset = preset;
    o.seed   = 31;
    o.quiet  = true;
    struct dsv4_err err;
    dsv4_engine    *e = NULL;
    if (gen_checkpoint(&o, dir, &err) != DSV4_OK) {
        CHECKF(0, "gen %s: %s", preset, err.msg);
        return NULL;
    }
    struct dsv4_engine_params ep;
    test_engine_params(&ep);
    if (dsv4_engine_open(&e, dir, &ep, &err)) {
        CHECKF(0, "open %s: %s", preset, err.msg);
        return NULL;
    }
    return e;
}

static dsv4_session *new_session(struct test_ctx *t, dsv4_engine *e)
{
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx = MAX_CTX;
    sp.mtp     = dsv4_engine_model(e)->w.has_mtp;
    dsv4_session   *s = NULL;
    struct dsv4_err err;
    CHECKF(dsv4_session_create(e, &sp, &s, &err) == DSV4_OK, "session: %s", err.msg);
    return s;
}

static void file_of(struct test_ctx *t, const char *preset, int P, char *out, size_t cap)
{
    snprintf(out, cap, "%s/session-%s-%d.dsv4s", t->tmpdir, preset, P);
}

/* Saves after P tokens, resumes in B, compares B with A and with a cold C. */
static void resume_at(struct test_ctx *t, dsv4_engine *e, const char *preset, const int32_t *tok, int P)
{
    size_t          V = (size_t)dsv4_engine_model(e)->cfg.vocab_size;
    struct dsv4_err err;
    char            path[600];
    file_of(t, preset, P, path, sizeof(path));
    dsv4_session *a = new_session(t, e), *b = new_session(t, e), *c = new_session(t, e);
    float        *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    float        *lc = malloc(sizeof(float) * V * (size_t)(P + CONT));
    int32_t       got[MAX_CTX];
    int           n = -1;
    if (!a || !b || !c || !la || !lb || !lc) goto done;
    CHECK(dsv4_session_eval(a, tok, P, NULL, NULL, NULL, &err) == DSV4_OK);
    CHECKF(dsv4_session_save(a, path, tok, P, &err) == DSV4_OK, "save: %s", err.msg);
    CHECKF(dsv4_session_load(b, path, got, MAX_CTX, &n, &err) == DSV4_OK, "load: %s", err.msg);
    CHECKF(n == P && dsv4_session_pos(b) == P && !memcmp(got, tok, sizeof(int32_t) * (size_t)P),
           "%s at %d: loaded %d tokens, position %d", preset, P, n, dsv4_session_pos(b));
    CHECK(dsv4_session_logits(b) && !memcmp(dsv4_session_logits(a), dsv4_session_logits(b), sizeof(float) * V));
    CHECK(dsv4_session_eval(c, tok, P + CONT, lc, NULL, NULL, &err) == DSV4_OK);
    int bad_a = 0, bad_c = 0;
    for (int j = P; j < P + CONT; j++) {
        CHECK(dsv4_session_eval(a, tok + j, 1, la, NULL, NULL, &err) == DSV4_OK);
        CHECK(dsv4_session_eval(b, tok + j, 1, lb, NULL, NULL, &err) == DSV4_OK);
        bad_a += memcmp(la, lb, sizeof(float) * V) != 0;
        bad_c += memcmp(lc + (size_t)j * V, lb, sizeof(float) * V) != 0;
    }
    CHECKF(bad_a == 0 && bad_c == 0, "%s saved at %d: %d of %d steps differ from A, %d from a cold session", preset, P,
           bad_a, CONT, bad_c);
done:
    free(la);
    free(lb);
    free(lc);
    dsv4_session_free(a);
    dsv4_session_free(b);
    dsv4_session_free(c);
}

int32_t *test_session_tokens(dsv4_engine *e, unsigned long long seed, int n)
{
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; tok && i < n; i++)
        tok[i] = (int32_t)(test_rand_u64(&seed) % (unsigned)dsv4_engine_model(e)->cfg.vocab_size);
    return tok;
}

static void test_resume_bit_exact(struct test_ctx *t)
{
    const char *presets[] = { "tiny-a", "tiny-b" };
    for (int i = 0; i < 2; i++) {
        dsv4_engine *e   = test_session_model(t, presets[i]);
        int32_t     *tok = e ? test_session_tokens(e, 7 + (unsigned)i, MAX_CTX) : NULL;
        if (tok) {
            const int at[] = { 5, 140, 256 };
            for (int k = 0; k < 3; k++) resume_at(t, e, presets[i], tok, at[k]);
        }
        free(tok);
        dsv4_engine_close(e);
    }
}

/* ------------------------------------------------------------------ bad files */

static bool copy_file(const char *from, const char *to, long keep, long flip_at, int version)
{
    FILE *f = fopen(from, "rb");
    if (!f) return false;
    static unsigned char buf[1 << 24];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    if (keep >= 0 && (size_t)keep < n) n = (size_t)keep;
    if (flip_at >= 0) buf[flip_at] ^= 0x10;
    if (version) buf[8] = (unsigned char)version;
    f = fopen(to, "wb");
    if (!f) return false;
    bool ok = fwrite(buf, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void expect_refused(struct test_ctx *t, dsv4_session *s, const char *path, int code, const char *why)
{
    int32_t         got[MAX_CTX];
    int             n = -1;
    struct dsv4_err err;
    err.msg[0] = 0;
    int rc     = dsv4_session_load(s, path, got, MAX_CTX, &n, &err);
    CHECKF(rc == code && strstr(err.msg, why) && n == 0 && dsv4_session_pos(s) == 0 && !dsv4_session_logits(s),
           "%s: rc %d (want %d), \"%s\" (want \"%s\"), %d tokens, position %d", path, rc, code, err.msg, why, n,
           dsv4_session_pos(s));
}

static void test_bad_files(struct test_ctx *t)
{
    dsv4_engine  *ea = test_session_model(t, "tiny-a"), *eb = test_session_model(t, "tiny-b");
    dsv4_session *sa = ea ? new_session(t, ea) : NULL, *sb = eb ? new_session(t, eb) : NULL;
    int32_t      *tok = ea ? test_session_tokens(ea, 3, MAX_CTX) : NULL;
    struct dsv4_err err;
    char good[600], other[600], bad[600];
    if (!sa || !sb || !tok) goto done;
    file_of(t, "bad-a", 20, good, sizeof(good));
    file_of(t, "bad-b", 20, other, sizeof(other));
    file_of(t, "bad-x", 20, bad, sizeof(bad));
    CHECK(dsv4_session_eval(sa, tok, 20, NULL, NULL, NULL, &err) == DSV4_OK);
    CHECK(dsv4_session_save(sa, good, tok, 20, &err) == DSV4_OK);
    CHECK(dsv4_session_save(sa, good, tok, 19, &err) == DSV4_EINVAL);
    for (int i = 0; i < 20; i++) tok[i] %= 100; /* ids both vocabularies hold */
    CHECK(dsv4_session_eval(sb, tok, 20, NULL, NULL, NULL, &err) == DSV4_OK);
    CHECK(dsv4_session_save(sb, other, tok, 20, &err) == DSV4_OK);
    /* each load below starts from a session that holds tokens: a refusal must reset it */
    CHECK(copy_file(good, bad, 1000, -1, 0));
    expect_refused(t, sa, bad, DSV4_EFORMAT, "bytes, the header says");
    CHECK(dsv4_session_eval(sa, tok, 3, NULL, NULL, NULL, &err) == DSV4_OK);
    CHECK(copy_file(good, bad, 60, -1, 0));
    expect_refused(t, sa, bad, DSV4_EFORMAT, "truncated");
    CHECK(dsv4_session_eval(sa, tok, 3, NULL, NULL, NULL, &err) == DSV4_OK);
    CHECK(copy_file(good, bad, -1, DSV4_KV_DISK_HEADER + 5000, 0));
    expect_refused(t, sa, bad, DSV4_EFORMAT, "payload checksum mismatch");
    CHECK(copy_file(good, bad, -1, 30, 0));
    expect_refused(t, sa, bad, DSV4_EFORMAT, "header checksum mismatch");
    CHECK(copy_file(good, bad, -1, -1, DSV4_KV_DISK_VERSION + 1));
    expect_refused(t, sa, bad, DSV4_EFORMAT, "format version 2");
    expect_refused(t, sa, other, DSV4_EFORMAT, "another model's identity");
    expect_refused(t, sb, good, DSV4_EFORMAT, "another model's identity");
    file_of(t, "missing", 0, bad, sizeof(bad));
    expect_refused(t, sa, bad, DSV4_EIO, "cannot open");
    /* and the good file still loads after all that */
    int32_t got[MAX_CTX];
    int     n = 0;
    CHECKF(dsv4_session_load(sa, good, got, MAX_CTX, &n, &err) == DSV4_OK && n == 20, "reload: %s", err.msg);
done:
    free(tok);
    dsv4_session_free(sa);
    dsv4_session_free(sb);
    dsv4_engine_close(ea);
    dsv4_engine_close(eb);
}

/* ------------------------------------------------------------------ dsv4 chat */

char *test_session_chat(struct test_ctx *t, const char *lines, const char *opts)
{
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof(cmd), "printf '%s' | %s chat -m models/kjv-v4-tiny -n 12 --temp 0%s %s 2>&1",
             lines, getenv("DSV4_BIN"), test_backend_arg(), opts);
    int rc = test_run(cmd, &out);
    CHECKF(rc == 0 && out, "%s: exit %d\n%s", cmd, rc, out ? out : "");
    return out;
}

/* The last line of out (the reply to the last turn), cut in place. */
const char *test_session_last_line(char *out)
{
    size_t n = strlen(out);
    while (n && out[n - 1] == '\n') out[--n] = 0;
    char *nl = strrchr(out, '\n');
    return nl ? nl + 1 : out;
}

static void test_chat_resume(struct test_ctx *t)
{
    if (!getenv("DSV4_BIN")) {
        CHECKF(0, "DSV4_BIN not set (run through make test)");
        return;
    }
    char save[600], opts[1300];
    snprintf(save, sizeof(save), "%s/chat-session", t->tmpdir);
    char *both = test_session_chat(t, "In the beginning\\nAnd God said\\n", "");
    snprintf(opts, sizeof(opts), "--save %s", save);
    char *first = test_session_chat(t, "In the beginning\\n", opts);
    snprintf(opts, sizeof(opts), "--load %s", save);
    char *resumed = test_session_chat(t, "And God said\\n", opts);
    if (both && first && resumed) {
        CHECKF(strstr(resumed, "resumed") && strstr(resumed, ": 1 turns,"), "no resume line:\n%s", resumed);
        const char *want = test_session_last_line(both), *got = test_session_last_line(resumed);
        CHECKF(!strcmp(want, got), "second reply after a resume \"%s\", in one process \"%s\"", got, want);
    }
    free(both);
    free(first);
    free(resumed);
}

const struct test_case test_group_session[] = {
    { "resume_bit_exact", test_resume_bit_exact },
    { "bad_files", test_bad_files },
    { "chat_resume", test_chat_resume },
    { NULL, NULL },
};
