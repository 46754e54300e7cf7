/*
 * test_fuzz_replay.c - the fuzz group: replays every libFuzzer corpus (tests/fuzz/corpus/<name>)
 * through its harness, built without libFuzzer by `make test` as
 * $(BUILD)/fuzz-replay/fuzz_<name> (tests/fuzz/replay_main.c), next to this runner. Under
 * `make test-san` the replays run under ASan and UBSan.
 *
 * Only crashes, sanitizer reports and hangs count (the replay driver exits non-zero on
 * each, naming a hanging input), not outputs. Each corpus must hold at least MIN_FILES
 * inputs, so an emptied directory fails rather than passing trivially. A replay binary
 * that cannot be found is a failure: `make test` builds them.
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_cases.h"

enum { MIN_FILES = 5 };

/* The build directory: where this runner lives ($(BUILD)/run_tests). */
static bool build_dir(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0) return false;
    out[n]      = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) return false;
    *slash = '\0';
    return true;
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int            n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void replay(struct test_ctx *t, const char *name)
{
    char dir[PATH_MAX], bin[PATH_MAX + 64], corpus[128];
    CHECKF(build_dir(dir, sizeof(dir)), "cannot tell the build directory from /proc/self/exe");
    snprintf(bin, sizeof(bin), "%s/fuzz-replay/fuzz_%s", dir, name);
    snprintf(corpus, sizeof(corpus), "tests/fuzz/corpus/%s", name);
    int files = count_files(corpus);
    CHECKF(files >= MIN_FILES, "%s holds %d inputs, want at least %d", corpus, files, MIN_FILES);
    CHECKF(access(bin, X_OK) == 0, "%s is missing (make test builds it)", bin);
    if (files < 1 || access(bin, X_OK) != 0) return;
    char cmd[2 * PATH_MAX];
    snprintf(cmd, sizeof(cmd), "'%s' '%s'", bin, corpus);
    char *out = NULL;
    int   rc  = test_run(cmd, &out);
    int   n   = -1;
    const char *line = out ? strstr(out, "replayed ") : NULL;
    if (line) n = atoi(line + strlen("replayed "));
    CHECKF(rc == 0, "%s on %s exited %d:\n%.4000s", bin, corpus, rc, out ? out : "");
    CHECKF(n == files, "%s replayed %d of the %d inputs of %s", bin, n, files, corpus);
    free(out);
}

static void test_safetensors(struct test_ctx *t)
{
    replay(t, "safetensors");
}

static void test_tokenizer(struct test_ctx *t)
{
    replay(t, "tokenizer");
}

static void test_chat(struct test_ctx *t)
{
    replay(t, "chat");
}

static void test_config(struct test_ctx *t)
{
    replay(t, "config");
}

static void test_server(struct test_ctx *t)
{
    replay(t, "server");
}

const struct test_case test_group_fuzz[] = {
    { "replay_safetensors", test_safetensors },
    { "replay_tokenizer", test_tokenizer },
    { "replay_chat", test_chat },
    { "replay_config", test_config },
    { "replay_server", test_server },
    { NULL, NULL },
};
