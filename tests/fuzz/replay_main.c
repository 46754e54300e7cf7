/*
 * replay_main.c - runs a libFuzzer harness over saved inputs without libFuzzer, so that any
 * compiler (gcc included) can replay the corpora: `make test` links each
 * tests/fuzz/fuzz_<name>.c with this file into $(BUILD)/fuzz-replay/fuzz_<name>, and the
 * fuzz test group (tests/unit/test_fuzz_replay.c) runs it on tests/fuzz/corpus/<name>.
 *
 *   fuzz_<name> FILE_OR_DIR...     every regular file, directories one level deep, sorted
 *
 * Each input is copied into a buffer of exactly its size, as libFuzzer does, so a sanitizer
 * build catches a parser that reads one byte past the end. What counts is only that the
 * harness returns: a crash or sanitizer report kills the process, and an input that runs
 * longer than DSV4_REPLAY_TIMEOUT seconds (default 60) is reported by name as a hang
 * (exit 3). Exit 0 after the last input, with the count on stdout; 2 for unreadable
 * arguments.
 */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input running now, for the hang report (written from the signal handler). */
static char g_current[4096];

static void on_alarm(int sig)
{
    (void)sig;
    static const char a[] = "replay: hang: the harness did not return within the time limit on ";
    /* only async-signal-safe calls here */
    if (write(2, a, sizeof(a) - 1) < 0 || write(2, g_current, strlen(g_current)) < 0 || write(2, "\n", 1) < 0) {}
    _exit(3);
}

static int run_file(const char *path, unsigned timeout_s)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    size_t   cap = 4096, n = 0, r;
    uint8_t *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: out of memory reading %s\n", path);
        return -1;
    }
    uint8_t *exact = malloc(n ? n : 1); /* exactly n bytes, as libFuzzer passes them */
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    snprintf(g_current, sizeof(g_current), "%s", path);
    alarm(timeout_s);
    LLVMFuzzerTestOneInput(exact, n);
    alarm(0);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of a directory in name order (a stable replay order), dotfiles skipped. */
static int run_dir(const char *dir, unsigned timeout_s, int *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open %s\n", dir);
        return -1;
    }
    char         **names = NULL;
    size_t         n = 0, cap = 0;
    struct dirent *de;
    int            rc = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        if (n == cap) {
            cap          = cap ? 2 * cap : 64;
            char **nn    = realloc(names, cap * sizeof(*nn));
            if (!nn) {
                rc = -1;
                break;
            }
            names = nn;
        }
        size_t len = strlen(dir) + strlen(de->d_name) + 2;
        if (!(names[n] = malloc(len))) {
            rc = -1;
            break;
        }
        snprintf(names[n++], len, "%s/%s", dir, de->d_name);
    }
    closedir(d);
    if (names) qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (rc == 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(names[i], timeout_s)) rc = -1;
            else (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    const char *t         = getenv("DSV4_REPLAY_TIMEOUT");
    unsigned    timeout_s = t && atoi(t) > 0 ? (unsigned)atoi(t) : 60;
    signal(SIGALRM, on_alarm);
    int count = 0, rc = 0;
    for (int i = 1; i < argc && rc == 0; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            rc = -1;
        } else if (S_ISDIR(st.st_mode)) {
            rc = run_dir(argv[i], timeout_s, &count);
        } else if (run_file(argv[i], timeout_s) == 0) {
            count++;
        } else {
            rc = -1;
        }
    }
    if (argc < 2) fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    printf("replayed %d inputs\n", count);
    return rc || argc < 2 ? 2 : 0;
}
