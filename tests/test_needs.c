/*
 * test_needs.c - what a test needs besides the build, checked before it runs.
 *
 * The npm packages of tests/tokenizer, tests/server, tests/deploy and tests/webui are "present"
 * only when node is on PATH and every package pinned by the directory's package-lock.json is
 * installed at the locked version and integrity (npm records what it installed in node_modules/.package-lock.json,
 * the "hidden lockfile"): a stale node_modules counts as missing, so a changed lock file is
 * installed again by `make test` (tests/install_deps.sh) instead of being tested against
 * old packages. The chat page test (tests/webui) also needs Debian's chromium.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_cases.h"

static bool on_path(const char *prog)
{
    const char *path = getenv("PATH");
    if (!path) return false;
    char dir[4096];
    while (*path) {
        size_t n = strcspn(path, ":");
        if (n > 0 && n + strlen(prog) + 2 < sizeof(dir)) {
            snprintf(dir, sizeof(dir), "%.*s/%s", (int)n, path, prog);
            if (access(dir, X_OK) == 0) return true;
        }
        path += n;
        if (*path == ':') path++;
    }
    return false;
}

/* Every locked package is installed as locked; writes the first difference into why. */
static bool npm_dir_current(const char *dir, char *why, size_t cap)
{
    char lock_path[256], hidden_path[256];
    snprintf(lock_path, sizeof(lock_path), "%s/package-lock.json", dir);
    snprintf(hidden_path, sizeof(hidden_path), "%s/node_modules/.package-lock.json", dir);
    json_error_t je;
    json_t      *lock = json_load_file(lock_path, 0, &je);
    json_t      *have = json_load_file(hidden_path, 0, &je);
    bool         ok   = false;
    if (!lock) {
        snprintf(why, cap, "%s is unreadable", lock_path);
    } else if (!have) {
        snprintf(why, cap, "%s/node_modules is not installed", dir);
    } else {
        json_t     *want = json_object_get(lock, "packages");
        json_t     *got  = json_object_get(have, "packages");
        const char *name;
        json_t     *pkg;
        ok = json_is_object(want) && json_is_object(got);
        json_object_foreach(want, name, pkg) {
            if (!ok || name[0] == '\0') continue; /* "" is the project itself */
            json_t *g = json_object_get(got, name);
            const char *wv = json_string_value(json_object_get(pkg, "version"));
            const char *gv = json_string_value(json_object_get(g, "version"));
            const char *wi = json_string_value(json_object_get(pkg, "integrity"));
            const char *gi = json_string_value(json_object_get(g, "integrity"));
            char pj[512];
            snprintf(pj, sizeof(pj), "%s/%s/package.json", dir, name);
            if (!g || !wv || !gv || strcmp(wv, gv) != 0 || (wi && (!gi || strcmp(wi, gi) != 0)) ||
                access(pj, R_OK) != 0) {
                snprintf(why, cap, "%s/%s is not installed at the locked version %s", dir, name, wv ? wv : "?");
                ok = false;
            }
        }
    }
    json_decref(lock);
    json_decref(have);
    return ok;
}

static const char *npm_need(const char *dir, const char *what, char *buf, size_t cap)
{
    char why[1024];
    if (!on_path("node") || !on_path("npm")) {
        snprintf(buf, cap, "needs %s: node and npm are not installed (fix: apt-get install nodejs npm && npm ci --prefix %s)",
                 what, dir);
        return buf;
    }
    if (npm_dir_current(dir, why, sizeof(why))) return NULL;
    snprintf(buf, cap, "needs %s: %s (fix: npm ci --prefix %s)", what, why, dir);
    return buf;
}

const char *test_need_npm_dir(enum test_need need)
{
    switch (need) {
    case TEST_NEEDS_NPM_TOKENIZER: return "tests/tokenizer";
    case TEST_NEEDS_NPM_SERVER: return "tests/server";
    case TEST_NEEDS_NPM_DEPLOY: return "tests/deploy";
    case TEST_NEEDS_WEBUI: return "tests/webui";
    default: return NULL;
    }
}

static const char *npm_what(enum test_need need)
{
    switch (need) {
    case TEST_NEEDS_NPM_TOKENIZER: return "tokenizers.js and the DeepSeek-V3 tokenizer.json";
    case TEST_NEEDS_NPM_SERVER: return "the openai npm client";
    case TEST_NEEDS_NPM_DEPLOY: return "js-yaml and kubernetes-models";
    case TEST_NEEDS_WEBUI: return "puppeteer-core";
    default: return "";
    }
}

const char *test_need_npm_missing(enum test_need need, char *buf, size_t cap)
{
    const char *dir = test_need_npm_dir(need);
    return dir ? npm_need(dir, npm_what(need), buf, cap) : NULL;
}

const char *test_need_missing(enum test_need need, char *buf, size_t cap)
{
    switch (need) {
    case TEST_NEEDS_NOTHING: return NULL;
    case TEST_NEEDS_NPM_TOKENIZER:
    case TEST_NEEDS_NPM_SERVER:
    case TEST_NEEDS_NPM_DEPLOY: return test_need_npm_missing(need, buf, cap);
    case TEST_NEEDS_WEBUI:
        /* the browser test launches chromium from PATH (or $CHROMIUM) */
        if (!on_path("chromium") && !getenv("CHROMIUM")) {
            snprintf(buf, cap, "needs chromium, the browser of the chat page test (fix: apt-get install chromium, "
                               "or tools/install_deps.sh test)");
            return buf;
        }
        return test_need_npm_missing(need, buf, cap);
    case TEST_NEEDS_MPI:
        /* sanitizer builds leave MPI out on purpose (Makefile): the tests skip there as not
         * for this build (test_mpi.c), not as missing */
        if (!DSV4_HAVE_MPI && TEST_SANITIZED) return NULL;
        if (!DSV4_HAVE_MPI || !on_path("mpirun")) {
            snprintf(buf, cap, "needs %s (fix: apt-get install openmpi-bin libopenmpi-dev, or tools/install_deps.sh "
                               "test; then make)", DSV4_HAVE_MPI ? "mpirun" : "a build with MPI");
            return buf;
        }
        return NULL;
    }
    snprintf(buf, cap, "unknown requirement %d", (int)need);
    return buf;
}
