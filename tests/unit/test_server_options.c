/*
 * test_server_options.c - every engine option `dsv4 serve --help` lists reaches the engine
 * (run in the server group by test_server.c).
 *
 * The test reads the "engine options:" section of `dsv4 serve --help`, fails on an option it
 * has no case for (a new engine option must come with one), starts a server with each set to
 * a value that is not its default, and checks that the engine reports that value: in the
 * dsv4_engine_info series of /metrics and in the startup line. --gemm-min was once accepted
 * and dropped on its way to the worker; this is the test that would have caught it. A second
 * server takes the crossovers from DSV4_GEMM_MIN alone.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"
#include "test_server_util.h"

/* One engine option: the value given, what /metrics says for it and what the log line says. */
struct eopt {
    const char *name;
    const char *value;  /* NULL for a flag; "@" = a file in the test's directory */
    const char *metric; /* a label of dsv4_engine_info */
    const char *line;   /* a part of the "engine:" startup line */
};

static const struct eopt EOPTS[] = {
    { "--threads", "3", "threads=\"3\"", "3 threads" },
    { "--revision", "initial", "revision=\"initial\"", "revision initial" },
    { "--cpu-level", "scalar", "level=\"scalar\"", "level scalar" },
    { "--gemm-min", "3,7,9", "gemm_min=\"3,7,9\"", "gemm-min 3,7,9" },
    { "--no-tiles", NULL, "tiles=\"off\"", "tiles off" },
    /* with every option at once it repeats --no-tiles; alone, below, it sets what it names */
    { "--backend-opt", "tiles=0", "tiles=\"off\"", "tiles off" },
    { "--profile", "@", "profile=\"on\"", "profile on" },
    { "--backend", "cpu-staged", "backend=\"cpu-staged\"", "backend cpu-staged" },
    /* 1 in one process; `run_tests --mpi N` appends --ep N, which wins (want_of) */
    { "--ep", "1", "ep_ranks=\"1\"", "expert ranks 1" },
    { "--ep-dispatch", "tokens", "ep_dispatch=\"tokens\"", "dispatch tokens" },
};
enum { N_EOPTS = sizeof(EOPTS) / sizeof(EOPTS[0]) };

/* What /metrics and the startup line must say for o: its own value, but the ranks of the
 * run for --ep under `run_tests --mpi N`. */
static void want_of(const struct eopt *o, char metric[64], char line[64])
{
    snprintf(metric, 64, "%s", o->metric);
    snprintf(line, 64, "%s", o->line);
    if (!strcmp(o->name, "--ep") && test_mpi_ranks > 1) {
        snprintf(metric, 64, "ep_ranks=\"%d\"", test_mpi_ranks);
        snprintf(line, 64, "expert ranks %d", test_mpi_ranks);
    }
}

/* The options of the "engine options:" section of `dsv4 serve --help`, into names (count). */
static int help_engine_options(struct test_ctx *t, char names[][32], int cap)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return -1;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "'%s' serve --help", bin);
    FILE *f = popen(cmd, "r");
    CHECKF(f != NULL, "cannot run %s", cmd);
    if (!f) return -1;
    char line[512];
    bool in = false;
    int  n  = 0;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "engine options:", 15)) {
            in = true;
            continue;
        }
        if (in && line[0] != ' ') break; /* the next section or the end */
        char name[32];
        if (in && sscanf(line, " %31s", name) == 1 && name[0] == '-' && n < cap) snprintf(names[n++], 32, "%s", name);
    }
    CHECKF(pclose(f) == 0, "%s did not exit 0", cmd);
    return n;
}

static bool log_has(const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f)) found = strstr(line, "engine:") && strstr(line, what);
    fclose(f);
    return found;
}

/* The dsv4_engine_info line of /metrics, malloc'd (NULL when absent). */
static char *engine_info(struct tsrv *s)
{
    char *text = NULL;
    if (tsrv_get(s, "/metrics", NULL, &text) != 200 || !text) {
        free(text);
        return NULL;
    }
    char *at = strstr(text, "\ndsv4_engine_info{"), *line = NULL;
    if (at) {
        size_t len = strcspn(at + 1, "\n");
        line       = strndup(at + 1, len);
    }
    free(text);
    return line;
}

void tsrv_test_engine_options(struct test_ctx *t, const char *model_dir)
{
    char names[32][32];
    int  n = help_engine_options(t, names, 32);
    CHECKF(n >= N_EOPTS, "serve --help lists %d engine options, the test knows %d", n, (int)N_EOPTS);
    for (int i = 0; i < n; i++) {
        bool known = false;
        for (int k = 0; k < N_EOPTS; k++) known = known || !strcmp(names[i], EOPTS[k].name);
        CHECKF(known, "serve --help lists the engine option %s, which this test does not set", names[i]);
    }

    char trace[512], args[1024] = "", *p = args;
    snprintf(trace, sizeof(trace), "%s/serve-options.trace", t->tmpdir);
    remove(trace);
    for (int k = 0; k < N_EOPTS; k++)
        p += snprintf(p, sizeof(args) - (size_t)(p - args), "%s%s%s ", EOPTS[k].name, EOPTS[k].value ? " " : "",
                      !EOPTS[k].value ? "" : !strcmp(EOPTS[k].value, "@") ? trace : EOPTS[k].value);
    struct tsrv s;
    if (!tsrv_start(t, &s, model_dir, args)) return;
    char *info = engine_info(&s);
    CHECKF(info != NULL, "/metrics has no dsv4_engine_info");
    for (int k = 0; k < N_EOPTS && info; k++) {
        char metric[64], line[64];
        want_of(&EOPTS[k], metric, line);
        CHECKF(strstr(info, metric) != NULL, "%s: /metrics says %s, want %s", EOPTS[k].name, info, metric);
        CHECKF(log_has(s.log, line), "%s: no '%s' in the startup line (log: %s)", EOPTS[k].name, line, s.log);
    }
    free(info);
    int code = tsrv_stop(&s, SIGTERM, 20);
    CHECKF(code == 0, "exit status %d after SIGTERM (log: %s)", code, s.log);
    struct stat st;
    CHECKF(stat(trace, &st) == 0 && st.st_size > 0, "--profile: no trace written to %s", trace);

    /* the crossovers from the environment alone (flags win over it; none given here) */
    setenv("DSV4_GEMM_MIN", "4,6,8", 1);
    bool up = tsrv_start(t, &s, model_dir, NULL);
    unsetenv("DSV4_GEMM_MIN");
    if (!up) return;
    info = engine_info(&s);
    CHECKF(info && strstr(info, "gemm_min=\"4,6,8\""), "DSV4_GEMM_MIN=4,6,8: /metrics says %s", info ? info : "nothing");
    free(info);
    tsrv_stop(&s, SIGTERM, 20);

    /* the backend's options as key=value, the CPU's spelled without their flags */
    if (!tsrv_start(t, &s, model_dir, "--backend-opt gemm_min=5,6,7 --backend-opt level=scalar")) return;
    info = engine_info(&s);
    CHECKF(info && strstr(info, "gemm_min=\"5,6,7\"") && strstr(info, "level=\"scalar\"") && strstr(info, "tiles=\"on\""),
           "--backend-opt gemm_min=5,6,7 --backend-opt level=scalar: /metrics says %s", info ? info : "nothing");
    free(info);
    tsrv_stop(&s, SIGTERM, 20);
}

/* Every command that opens a model lists the same engine options in its --help and takes
 * them; a bad value or an unknown option is a usage error (2) that names the option. */
void tsrv_test_model_commands_options(struct test_ctx *t, const char *model_dir)
{
    static const char *const cmds[] = { "run", "chat", "perplexity", "logits", "align", "batch", "bench", "serve" };
    const char              *bin    = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    char  cmd[2048], *out = NULL;
    for (size_t c = 0; c < sizeof(cmds) / sizeof(cmds[0]); c++) {
        snprintf(cmd, sizeof(cmd), "'%s' %s --help", bin, cmds[c]);
        int rc = test_run(cmd, &out);
        const char *eng = out ? strstr(out, "\nengine options:\n") : NULL;
        CHECKF(rc == 0 && eng, "%s --help: exit %d, no engine options section", cmds[c], rc);
        for (int k = 0; eng && k < N_EOPTS; k++)
            CHECKF(strstr(eng, EOPTS[k].name) != NULL, "%s --help lists no %s", cmds[c], EOPTS[k].name);
        free(out);
        snprintf(cmd, sizeof(cmd), "'%s' %s -m '%s' --threads many", bin, cmds[c], model_dir);
        rc = test_run(cmd, &out);
        CHECKF(rc == 2 && out && strstr(out, "--threads"), "%s --threads many: exit %d: %s", cmds[c], rc, out ? out : "");
        free(out);
        snprintf(cmd, sizeof(cmd), "'%s' %s -m '%s' --revision newest", bin, cmds[c], model_dir);
        rc = test_run(cmd, &out);
        CHECKF(rc == 2 && out && strstr(out, "--revision"), "%s --revision newest: exit %d: %s", cmds[c], rc,
               out ? out : "");
        free(out);
        snprintf(cmd, sizeof(cmd), "'%s' %s --no-such-option", bin, cmds[c]);
        rc = test_run(cmd, &out);
        CHECKF(rc == 2 && out && strstr(out, "'--no-such-option'"), "%s --no-such-option: exit %d", cmds[c], rc);
        free(out);
    }
    /* and they take effect: two tokens at a capped level, one thread, the first revision */
    snprintf(cmd, sizeof(cmd), "'%s' run -m '%s' --tokens 1,2,3 -n 2 --ids --threads 1 --revision initial --cpu-level scalar",
             bin, model_dir);
    int rc = test_run(cmd, &out);
    CHECKF(rc == 0, "%s: exit %d: %s", cmd, rc, out ? out : "");
    free(out);
}
