/*
 * err.c - status strings, the caller-owned error sentence, assertions and the log sink.
 *
 * The library never prints on its own: messages go to the engine's log callback, or
 * nowhere. Assertion failures are the one exception: they mean a bug, print file:line and
 * abort (they are never used for bad input, which always gets a status code).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

const char *dsv4_status_str(int status)
{
    switch (status) {
    case DSV4_OK:           return "ok";
    case DSV4_EINVAL:       return "invalid argument";
    case DSV4_ENOMEM:       return "out of memory";
    case DSV4_EIO:          return "input/output error";
    case DSV4_EFORMAT:      return "malformed file";
    case DSV4_ECHECKPOINT:  return "checkpoint does not match its config";
    case DSV4_ERANGE:       return "value out of range";
    case DSV4_EUNSUPPORTED: return "unsupported";
    case DSV4_EFULL:        return "resource exhausted";
    case DSV4_ECANCELED:    return "cancelled";
    case DSV4_EINTERNAL:    return "internal error";
    default:                return "unknown status";
    }
}

int dsv4_err_set(struct dsv4_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

void dsv4_err_clear(struct dsv4_err *err)
{
    if (err) {
        err->code   = DSV4_OK;
        err->msg[0] = '\0';
    }
}

_Noreturn void dsv4_assert_fail(const char *file, int line, const char *expr)
{
    fprintf(stderr, "dsv4: assertion failed at %s:%d: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}

void dsv4_log(const struct dsv4_logger *lg, enum dsv4_log_level level, const char *fmt, ...)
{
    if (!lg || !lg->fn) return;
    char    buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    lg->fn(lg->ud, level, buf);
}
