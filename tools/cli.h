/*
 * cli.h - the subcommands of the dsv4 binary and small argument helpers they share.
 * Each cmd_* is a thin front end: parse options, call the library, print, return an exit
 * status (0 ok, 1 failure, 2 usage error).
 */
#ifndef DSV4_CLI_H
#define DSV4_CLI_H

#include <stdbool.h>
#include <stdint.h>

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

/* The engine's backend choices from the environment, which the flags then override:
 * DSV4_CPU (level), DSV4_GEMM_MIN (GEMM crossovers), DSV4_TILES=0 (no tiles), DSV4_PROFILE=FILE
 * (op trace). The library
 * itself reads no environment variable. Call after dsv4_engine_params_default. */
void cli_engine_env(struct dsv4_engine_params *ep);
/* The backend flags every model command takes: --backend cpu, --cpu-level L, --gemm-min S, --no-tiles,
 * --profile FILE. 1 when argv[*i] was one (its value consumed), 0 when not, -1 after an
 * error message (exit 2). */
int cli_engine_option(const char *cmd, int argc, char **argv, int *i, struct dsv4_engine_params *ep);
/* Their usage lines. */
#define CLI_ENGINE_USAGE                                                                            \
    "  --cpu-level L          ref|scalar|avx2|avx512|avx512bf16 (default: the best; env DSV4_CPU)\n" \
    "  --gemm-min A,B,C       FP8,FP4,BF16 token counts from which the f32 kernels take the GEMM\n" \
    "                         (default: measured for this core; env DSV4_GEMM_MIN)\n"            \
    "  --no-tiles             keep the checkpoint's layout (env DSV4_TILES=0)\n"                    \
    "  --profile FILE         Chrome trace of every op, per-op shares at exit (env DSV4_PROFILE)\n"   \
    "  --backend NAME         the backend (default cpu, the one this build has)\n"

/* Returns argv[*i + 1] and advances, or prints a "needs a value" error and returns NULL. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);
/* The value of --revision (argv[*i] is the option): current or initial; prints the error. */
bool cli_revision(const char *cmd, int argc, char **argv, int *i, enum dsv4_revision *rev);
/*
 * The sampling options of generating commands, argv[*i] being an option: --temp, --top-k,
 * --top-p, --min-p, --seed (sets *seeded when given). Returns 1 when it was one of them (its
 * value consumed), 0 when it is another option, -1 on a bad value (message printed).
 */
int cli_sampler_option(const char *cmd, int argc, char **argv, int *i, struct dsv4_sampler_params *sp, bool *seeded);

#endif
