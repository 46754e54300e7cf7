/* cli.c - argument helpers shared by the subcommands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

bool cli_parse_int(const char *cmd, const char *opt, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno       = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "dsv4 %s: %s must be an integer in [%lld, %lld], got '%s'\n", cmd, opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno    = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "dsv4 %s: %s must be a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "dsv4 %s: option %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}
