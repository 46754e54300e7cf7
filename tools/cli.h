/*
 * cli.h - the subcommands of the dsv4 binary and small argument helpers they share.
 * Each cmd_* is a thin front end: parse options, call the library, print, return an exit
 * status (0 ok, 1 failure, 2 usage error).
 */
#ifndef DSV4_CLI_H
#define DSV4_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsv4.h"

struct cli_command {
    const char *name;
    const char *help;
    int (*fn)(int argc, char **argv);
};

int cmd_inspect(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_align(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_ops(int argc, char **argv);
int cmd_test_ops(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_loadtest(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);

/* Parses a decimal integer in [lo, hi]; prints "dsv4 CMD: OPT ..." and returns false on error. */
bool cli_parse_int(const char *cmd, const char *opt, const char *s, long long lo, long long hi, long long *out);
bool cli_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* Parses token ids separated by commas, spaces or newlines into a malloc'd array. */
bool cli_parse_tokens(const char *cmd, const char *text, int32_t **ids, int *n);
/* Reads a tokens file (same syntax). */
bool cli_read_tokens_file(const char *cmd, const char *path, int32_t **ids, int *n);
/* Writes n floats (little-endian f32) to path. */
bool cli_write_f32(const char *cmd, const char *path, const float *data, size_t n);
/* Log sink printing warnings and errors to stderr, prefixed "dsv4 CMD:" (ud = cmd name). */
void cli_log_stderr(void *ud, enum dsv4_log_level level, const char *msg);
/* Monotonic seconds. */
double cli_now(void);

/* The engine's defaults (dsv4_engine_params_default) and the backend choices from the
 * environment, which the flags then override: DSV4_CPU (level), DSV4_GEMM_MIN (GEMM
 * crossovers), DSV4_TILES=0 (no tiles), DSV4_PROFILE=FILE (op trace). The library itself
 * reads no environment variable. */
void cli_engine_params(struct dsv4_engine_params *ep);
/* Appends "key=val" (key NULL: val is the entry) to ep->backend_opts, in a string kept for
 * the life of the process; false when out of memory. */
bool cli_backend_opt(struct dsv4_engine_params *ep, const char *key, const char *val);
/* ==================================================================================== */
/* Option tables: each command declares its options once; parsing and usage come from it */
/* ==================================================================================== */

enum cli_type {
    CLI_FLAG,   /* bool = true; takes no value */
    CLI_STR,    /* const char * = the value (argv's, lives as long as the process) */
    CLI_INT,    /* int in [lo, hi] */
    CLI_LLONG,  /* long long in [lo, hi] */
    CLI_FLOAT,  /* float in [lo, hi] */
    CLI_DOUBLE, /* double in [lo, hi] */
    CLI_MIB,    /* size_t bytes from a count of MiB in [lo, hi] */
    CLI_SIZE,   /* size_t in [lo, hi] */
    CLI_BYTES,  /* uint64_t bytes in [lo, hi], with an optional K, M, G or T suffix (x 1024^n) */
    CLI_CALL,   /* call(): the option's own syntax (arg NULL: a flag, value NULL) */
};

struct cli_opt {
    const char   *name;  /* "--ctx" */
    const char   *alias; /* another spelling ("-m" for "--model"), or NULL */
    const char   *arg;   /* the value's name in the usage ("N"); NULL for a flag */
    const char   *help;  /* the usage text; '\n' continues on an indented line */
    enum cli_type type;
    size_t        off;   /* the target: offsetof in the group's struct */
    double        lo, hi;
    /* CLI_CALL: parses v (NULL for a flag) into base (the group's struct); false after
     * printing "dsv4 CMD: OPT ..." */
    bool (*call)(const struct cli_opt *o, const char *cmd, const char *v, void *base);
};

/* Options that fill one struct, under a heading in the usage (NULL: the command's own). */
struct cli_group {
    const char           *heading;
    const struct cli_opt *opts;
    size_t                n;
    void                 *base;
};

struct cli_spec {
    const char             *cmd;      /* "serve" */
    const char             *synopsis; /* the "usage: ..." lines and any text before the options */
    const struct cli_group *groups;
    size_t                  n_groups;
    const char             *epilog;   /* text after the options, or NULL */
};

enum { CLI_PARSED = -1 };

/* Parses argv[1..argc) (every argument an option; -h/--help print the usage to stdout).
 * CLI_PARSED when all were parsed; else the exit status: 0 after --help, 2 after a usage
 * error (message naming the option printed, and the usage for an unknown option). */
int  cli_parse(const struct cli_spec *spec, int argc, char **argv);
/* The usage, generated from the tables. */
void cli_usage(const struct cli_spec *spec, FILE *f);
/* A usage error: "dsv4 CMD: MSG" and the usage on stderr; returns 2. */
int  cli_usage_error(const struct cli_spec *spec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The engine options every command that opens a model takes (--threads, --cpu-level,
 * --gemm-min, --no-tiles, --backend-opt, --profile, --backend, --revision), declared once:
 * a new engine option is a line of cli.c's table and a field of struct dsv4_engine_params
 * (the CPU's options are entries of its backend_opts). A command
 * that opens no model (dsv4 ops: a backend alone) takes them without --revision. */
struct cli_group cli_engine_group(struct dsv4_engine_params *ep, bool opens_model);

/* The sampling options of generating commands: --temp, --top-k, --top-p, --min-p, --seed
 * (which also sets seeded). */
struct cli_sampling {
    struct dsv4_sampler_params sp;
    bool                       seeded;
};
struct cli_group cli_sampler_group(struct cli_sampling *s);

/* --kv-disk-dir and --kv-disk-budget of the one-session commands (run, chat): the prompt
 * cache (dsv4_prompt_cache_*) in DIR/session. */
struct cli_kv_disk {
    const char *dir;
    uint64_t    budget;
};
struct cli_group cli_kv_disk_group(struct cli_kv_disk *kd);
/* Opens the prompt cache for sessions like s when --kv-disk-dir was given (*pc NULL when
 * not); false after "dsv4 CMD: ..." on stderr (another process holds the directory, say). */
bool cli_prompt_cache_open(const char *cmd, const struct cli_kv_disk *kd, const dsv4_session *s,
                           dsv4_prompt_cache **pc);
/* Evaluates tokens[pos, n) through the prompt cache (pc NULL: plainly), printing one line
 * on stderr when the cache was searched: the tokens loaded and the time, or "no cached
 * prefix". Returns dsv4_prompt_cache_eval's code. */
int cli_prompt_cache_eval(const char *cmd, dsv4_prompt_cache *pc, dsv4_session *s, const int32_t *tokens, int n,
                          struct dsv4_err *err);

#endif
