/*
 * test_session_cache.c - the prompt cache of `dsv4 run` and `dsv4 chat`
 * (dsv4_prompt_cache_*, src/engine/session_cache.c).
 *
 * bit_exact: on tiny-a and tiny-b (MTP state on), for prompts of 511, 512 and 513 tokens
 * (a page boundary at 256 and 512), a first pass through an empty store loads nothing and
 * stores the deepest boundary, a second pass (a new session, the store reopened) loads it;
 * both leave logits bit-equal to a cold session's after the prompt and after each of four
 * more tokens. A prompt extending a stored one loads the shared prefix and matches a cold
 * session on the long prompt.
 * collision: a record of prompt A stored under prompt B's key (as a 64-bit key collision
 * would) is not loaded for B: B is evaluated cold, bit-exactly.
 * locked: a second open of a directory in use fails with the lock's message.
 * run_cli: `dsv4 run --ids` twice with one prompt: the second loads 512 of 600 tokens (its
 * stderr line) and prints the same ids as a run without the cache; a longer prompt loads the
 * shared prefix and prints a cold run's ids; prompts of 512, 513 and 511 tokens; a flipped
 * payload byte: the record is removed with a log line, a shallower one is loaded, the same
 * ids; a directory another process holds: exit 1 with the lock's message.
 * chat_cli: `dsv4 chat` twice with a long system prompt: the second start loads its prefix
 * and replies as a chat without the cache does.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/session_file.h"
#include "kv/kv_disk.h"
#include "test_cases.h"
#include "test_session.h"

enum { CTX = 800, CONT = 4, PAGE = DSV4_KV_PAGE_TOKENS };

static dsv4_session *session_of(struct test_ctx *t, dsv4_engine *e)
{
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx = CTX;
    sp.mtp     = dsv4_engine_model(e)->w.has_mtp;
    dsv4_session   *s = NULL;
    struct dsv4_err err;
    CHECKF(dsv4_session_create(e, &sp, &s, &err) == DSV4_OK, "session: %s", err.msg);
    return s;
}

/* The logits after the session's prompt of n tokens, then after each of CONT more tokens
 * fed one at a time, into out[(CONT + 1) * V]. */
static void trace(struct test_ctx *t, dsv4_session *s, const int32_t *tok, int n, float *out, size_t V)
{
    struct dsv4_err err;
    memcpy(out, dsv4_session_logits(s), sizeof(float) * V);
    for (int j = 0; j < CONT; j++) {
        CHECK(dsv4_session_eval(s, tok + n + j, 1, NULL, NULL, NULL, &err) == DSV4_OK);
        memcpy(out + (size_t)(j + 1) * V, dsv4_session_logits(s), sizeof(float) * V);
    }
}

static float *cold_trace(struct test_ctx *t, dsv4_engine *e, const int32_t *tok, int n, size_t V)
{
    struct dsv4_err err;
    dsv4_session   *s   = session_of(t, e);
    float          *out = malloc(sizeof(float) * V * (CONT + 1));
    if (s && out) {
        CHECK(dsv4_session_eval(s, tok, n, NULL, NULL, NULL, &err) == DSV4_OK);
        trace(t, s, tok, n, out, V);
    }
    dsv4_session_free(s);
    return out;
}

/* One pass of a prompt of n tokens through the store in dir: what it loads and saves, and
 * the logits against cold's. */
static void cached_pass(struct test_ctx *t, dsv4_engine *e, const char *dir, const int32_t *tok, int n,
                        int want_loaded, int want_saved, const float *cold)
{
    size_t                        V = (size_t)dsv4_engine_model(e)->cfg.vocab_size;
    struct dsv4_err               err;
    struct dsv4_prompt_cache_eval r = { 0 };
    dsv4_prompt_cache            *pc = NULL;
    dsv4_session                 *s  = session_of(t, e);
    float                        *got = malloc(sizeof(float) * V * (CONT + 1));
    if (!s || !got || !cold) goto done;
    CHECKF(dsv4_prompt_cache_open(&pc, s, dir, 0, &err) == DSV4_OK, "open %s: %s", dir, err.msg);
    if (!pc) goto done;
    CHECKF(dsv4_prompt_cache_eval(pc, s, tok, n, &r, &err) == DSV4_OK, "eval: %s", err.msg);
    CHECKF(r.probed && r.loaded == want_loaded && r.saved == want_saved && dsv4_session_pos(s) == n,
           "%d tokens: loaded %d (want %d), saved at %d (want %d), position %d", n, r.loaded, want_loaded, r.saved,
           want_saved, dsv4_session_pos(s));
    trace(t, s, tok, n, got, V);
    int bad = 0;
    for (int j = 0; j <= CONT; j++) bad += memcmp(got + (size_t)j * V, cold + (size_t)j * V, sizeof(float) * V) != 0;
    CHECKF(bad == 0, "%d tokens, %d loaded: %d of %d logit rows differ from a cold session's", n, r.loaded, bad,
           CONT + 1);
done:
    dsv4_prompt_cache_close(pc);
    dsv4_session_free(s);
    free(got);
}

static void bit_exact_on(struct test_ctx *t, const char *preset)
{
    dsv4_engine *e   = test_session_model(t, preset);
    int32_t     *tok = e ? test_session_tokens(e, 11, CTX) : NULL;
    size_t       V   = e ? (size_t)dsv4_engine_model(e)->cfg.vocab_size : 0;
    char         dir[600];
    const int    lens[] = { 2 * PAGE - 1, 2 * PAGE, 2 * PAGE + 1 };
    for (int i = 0; tok && i < 3; i++) {
        int    n = lens[i], at = n / PAGE * PAGE;
        float *cold = cold_trace(t, e, tok, n, V);
        snprintf(dir, sizeof(dir), "%s/pc-%s-%d", t->tmpdir, preset, n);
        cached_pass(t, e, dir, tok, n, 0, at, cold);
        cached_pass(t, e, dir, tok, n, at, 0, cold);
        free(cold);
    }
    /* a prompt extending a stored one: the shared prefix, then the new deepest boundary */
    snprintf(dir, sizeof(dir), "%s/pc-%s-ext", t->tmpdir, preset);
    const int steps[][3] = { { 300, 0, PAGE }, { 700, PAGE, 2 * PAGE }, { 600, 2 * PAGE, 0 } };
    for (int i = 0; tok && i < 3; i++) {
        float *cold = cold_trace(t, e, tok, steps[i][0], V);
        cached_pass(t, e, dir, tok, steps[i][0], steps[i][1], steps[i][2], cold);
        free(cold);
    }
    free(tok);
    dsv4_engine_close(e);
}

static void test_bit_exact(struct test_ctx *t)
{
    bit_exact_on(t, "tiny-a");
    bit_exact_on(t, "tiny-b");
}

static void test_collision(struct test_ctx *t)
{
    dsv4_engine         *e = test_session_model(t, "tiny-a");
    int32_t             *a = e ? test_session_tokens(e, 21, CTX) : NULL, *b = e ? test_session_tokens(e, 22, CTX) : NULL;
    dsv4_session        *s = e ? session_of(t, e) : NULL;
    struct dsv4_kv_disk *d = NULL;
    struct dsv4_err      err;
    uint8_t              id[DSV4_KV_DISK_ID_BYTES], *buf = NULL;
    size_t               len = 0;
    char                 dir[600], sub[700];
    snprintf(dir, sizeof(dir), "%s/pc-collision", t->tmpdir);
    snprintf(sub, sizeof(sub), "%s/session", dir);
    if (!a || !b || !s) goto done;
    CHECK(dsv4_session_eval(s, a, PAGE, NULL, NULL, NULL, &err) == DSV4_OK);
    CHECK(dsv4_session_identity(s, id) == DSV4_OK && dsv4_session_encode(s, a, PAGE, &buf, &len, &err) == DSV4_OK);
    CHECKF(dsv4_kv_disk_open(&d, sub, 1 << 30, id, NULL, &err) == DSV4_OK, "open: %s", err.msg);
    struct dsv4_kv_disk_meta meta = { 0, PAGE };
    if (d) CHECK(dsv4_kv_disk_put(d, dsv4_prompt_cache_key(PAGE, b, 1), &meta, buf, len, &err) == DSV4_OK);
    dsv4_kv_disk_close(d);
    float *cold = cold_trace(t, e, b, 300, (size_t)dsv4_engine_model(e)->cfg.vocab_size);
    cached_pass(t, e, dir, b, 300, 0, PAGE, cold); /* the put of B's record keeps A's: same key */
    cached_pass(t, e, dir, b, 300, 0, PAGE, cold);
    free(cold);
done:
    free(buf);
    free(a);
    free(b);
    dsv4_session_free(s);
    dsv4_engine_close(e);
}

static void test_locked(struct test_ctx *t)
{
    dsv4_engine       *e = test_session_model(t, "tiny-a");
    dsv4_session      *s = e ? session_of(t, e) : NULL;
    dsv4_prompt_cache *a = NULL, *b = NULL;
    struct dsv4_err    err;
    char               dir[600];
    snprintf(dir, sizeof(dir), "%s/pc-locked", t->tmpdir);
    if (s) {
        CHECKF(dsv4_prompt_cache_open(&a, s, dir, 0, &err) == DSV4_OK, "open: %s", err.msg);
        CHECKF(dsv4_prompt_cache_open(&b, s, dir, 0, &err) == DSV4_EIO && !b &&
                   strstr(err.msg, "in use by another process"),
               "second open: %s", err.msg);
    }
    dsv4_prompt_cache_close(a);
    dsv4_session_free(s);
    dsv4_engine_close(e);
}

/* ------------------------------------------------------------------ dsv4 run */

/* A prompt of n ids of the demo model (the first ones shared by every n). */
static char *ids_text(int n)
{
    char *s = malloc((size_t)n * 8 + 1), *p = s;
    for (int i = 0; s && i < n; i++) p += sprintf(p, "%s%d", i ? "," : "", (i * 37) % 500 + 5);
    return s;
}

/* `dsv4 run --ids` on a prompt of n ids (opts: more options); its stdout (the ids, malloc'd)
 * and its stderr into err (malloc'd); the exit status in *rc. */
static char *run_ids(struct test_ctx *t, int n, const char *opts, char **err, int *rc)
{
    char  cmd[8192], errf[600], *out = NULL, *ids = ids_text(n);
    size_t len = 0;
    snprintf(errf, sizeof(errf), "%s/pc-run.err", t->tmpdir);
    snprintf(cmd, sizeof(cmd), "(%s run -m models/kjv-v4-tiny -n 8 --temp 0 --ids%s --tokens %s %s 2>%s)",
             getenv("DSV4_BIN"), test_backend_arg(), ids ? ids : "1", opts, errf);
    *rc  = test_run(cmd, &out);
    *err = test_read_file(errf, &len);
    free(ids);
    return out;
}

/* Runs n ids through the store opts names and checks the ids against a cold run's and the
 * stderr for want ("loaded 512 of 600", "no cached prefix", ...). */
static void run_case(struct test_ctx *t, int n, const char *opts, const char *want, const char *want2)
{
    char *err0 = NULL, *err1 = NULL;
    int   rc0 = 0, rc1 = 0;
    char *cold = run_ids(t, n, "", &err0, &rc0), *got = run_ids(t, n, opts, &err1, &rc1);
    CHECKF(rc0 == 0 && rc1 == 0 && cold && got, "%d ids: exit %d / %d\n%s", n, rc0, rc1, err1 ? err1 : "");
    if (cold && got) CHECKF(!strcmp(cold, got), "%d ids: \"%s\" with the cache, \"%s\" cold", n, got, cold);
    CHECKF(err1 && strstr(err1, want) && (!want2 || strstr(err1, want2)), "%d ids: no \"%s\" / \"%s\" in:\n%s", n,
           want, want2 ? want2 : "", err1 ? err1 : "");
    free(err0);
    free(err1);
    free(cold);
    free(got);
}

/* Flips a payload byte of the record file of k pages in dir/session; false when none. */
static bool corrupt_record(const char *dir, int k)
{
    char path[1200], suffix[32];
    snprintf(path, sizeof(path), "%s/session", dir);
    snprintf(suffix, sizeof(suffix), "-%08x.kvc", 0x80000000u | (unsigned)k);
    DIR *d = opendir(path);
    bool ok = false;
    for (struct dirent *de; d && !ok && (de = readdir(d));) {
        size_t nl = strlen(de->d_name);
        if (nl < strlen(suffix) || strcmp(de->d_name + nl - strlen(suffix), suffix)) continue;
        snprintf(path, sizeof(path), "%s/session/%s", dir, de->d_name);
        FILE *f = fopen(path, "r+b");
        int   c = f && fseek(f, DSV4_KV_DISK_HEADER + 4000, SEEK_SET) == 0 ? fgetc(f) : EOF;
        ok      = c != EOF && fseek(f, DSV4_KV_DISK_HEADER + 4000, SEEK_SET) == 0 && fputc(c ^ 0x20, f) != EOF;
        if (f) ok = fclose(f) == 0 && ok;
    }
    if (d) closedir(d);
    return ok;
}

static void test_run_cli(struct test_ctx *t)
{
    if (!getenv("DSV4_BIN")) {
        CHECKF(0, "DSV4_BIN not set (run through make test)");
        return;
    }
    char dir[600], opts[700];
    snprintf(dir, sizeof(dir), "%s/pc-run", t->tmpdir);
    snprintf(opts, sizeof(opts), "--kv-disk-dir %s --kv-disk-budget 64M", dir);
    run_case(t, 600, opts, "no cached prefix of the 600 prompt tokens", NULL);
    run_case(t, 600, opts, "loaded 512 of 600 prompt tokens", NULL);
    run_case(t, 900, opts, "loaded 512 of 900 prompt tokens", NULL); /* stores 768 */
    run_case(t, 512, opts, "loaded 512 of 512 prompt tokens", NULL);
    run_case(t, 513, opts, "loaded 512 of 513 prompt tokens", NULL);
    run_case(t, 511, opts, "no cached prefix of the 511 prompt tokens", NULL); /* stores 256 */
    CHECK(corrupt_record(dir, 2));
    run_case(t, 600, opts, "payload checksum mismatch", "loaded 256 of 600 prompt tokens");
    /* another process on the directory: the command fails, naming the holder */
    dsv4_engine       *e  = test_session_model(t, "tiny-a");
    dsv4_session      *s  = e ? session_of(t, e) : NULL;
    dsv4_prompt_cache *pc = NULL;
    struct dsv4_err    err;
    snprintf(dir, sizeof(dir), "%s/pc-run-locked", t->tmpdir);
    snprintf(opts, sizeof(opts), "--kv-disk-dir %s", dir);
    if (s && dsv4_prompt_cache_open(&pc, s, dir, 0, &err) == DSV4_OK) {
        char *msg = NULL;
        int   rc  = 0;
        free(run_ids(t, 600, opts, &msg, &rc));
        CHECKF(rc == 1 && msg && strstr(msg, "in use by another process (pid"), "exit %d:\n%s", rc, msg ? msg : "");
        free(msg);
    } else {
        CHECKF(0, "open %s: %s", dir, err.msg);
    }
    dsv4_prompt_cache_close(pc);
    dsv4_session_free(s);
    dsv4_engine_close(e);
}

/* ------------------------------------------------------------------ dsv4 chat */

static void test_chat_cli(struct test_ctx *t)
{
    if (!getenv("DSV4_BIN")) {
        CHECKF(0, "DSV4_BIN not set (run through make test)");
        return;
    }
    char sys[2000] = "--system '", opts[3000];
    for (int i = 0; i < 30; i++) strcat(sys, "In the beginning God created the heaven and the earth. ");
    strcat(sys, "'");
    snprintf(opts, sizeof(opts), "%s --kv-disk-dir %s/pc-chat", sys, t->tmpdir);
    const char *lines = "And God said\\nAnd the earth\\n";
    char       *cold = test_session_chat(t, lines, sys), *first = test_session_chat(t, lines, opts);
    char       *second = test_session_chat(t, lines, opts);
    if (cold && first && second) {
        CHECKF(strstr(first, "prompt cache: no cached prefix"), "first start:\n%s", first);
        CHECKF(strstr(second, "prompt cache: loaded 256 of"), "second start loaded nothing:\n%s", second);
        const char *want = test_session_last_line(cold);
        CHECKF(!strcmp(test_session_last_line(first), want) && !strcmp(test_session_last_line(second), want),
               "last reply with the cache \"%s\" / \"%s\", without \"%s\"", test_session_last_line(first),
               test_session_last_line(second), want);
    }
    free(cold);
    free(first);
    free(second);
}

const struct test_case test_group_promptcache[] = {
    { "bit_exact", test_bit_exact },
    { "collision", test_collision },
    { "locked", test_locked },
    { "run_cli", test_run_cli },
    { "chat_cli", test_chat_cli },
    { NULL, NULL },
};
