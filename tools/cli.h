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

/* Parses a decimal integer in [lo, hi]; prints "dsv4 CMD: OPT ..." and returns false on error. */
bool cli_parse_int(const char *cmd, const char *opt, const char *s, long long lo, long long hi, long long *out);
bool cli_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* Returns argv[*i + 1] and advances, or prints a "needs a value" error and returns NULL. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

#endif
