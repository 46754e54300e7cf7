/*
 * pyjson.c - JSON text written exactly as Python's json.dumps(value, ensure_ascii=False)
 * writes it, because the official DeepSeek-V4 encoder puts json.dumps output into prompts
 * (tool schemas, non-string tool arguments, response formats) and the model was trained on
 * those bytes:
 *
 *   - separators ", " and ": ", keys in their original order (jansson keeps insertion order);
 *   - strings escape only '"', '\\' and the C0 controls (\b \f \n \r \t by name, the rest as
 *     \u00xx in lowercase hex); everything else, DEL and U+2028 included, is written raw;
 *   - integers in decimal; floats as repr(): the shortest digits that read back to the same
 *     double, fixed notation when -4 < exponent + 1 <= 16 (with ".0" for whole numbers),
 *     otherwise d.ddde+XX with at least two exponent digits.
 *
 * What jansson cannot hold (integers beyond 64 bits, NaN, Infinity) never reaches here: such
 * documents fail to parse earlier, and docs/TOKENIZER.md lists that difference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok.h"

void tok_pyjson_string(struct tok_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    tok_buf_putc(b, '"');
    size_t run = 0; /* bytes copied verbatim in one go */
    for (size_t i = 0; i < n; i++) {
        unsigned char c   = (unsigned char)s[i];
        const char   *esc = NULL;
        char          u[7];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            u[0] = '\\', u[1] = 'u', u[2] = '0', u[3] = '0', u[4] = hex[c >> 4], u[5] = hex[c & 15], u[6] = '\0';
            esc  = u;
        }
        if (!esc) {
            run++;
            continue;
        }
        tok_buf_put(b, s + i - run, run);
        run = 0;
        tok_buf_puts(b, esc);
    }
    tok_buf_put(b, s + n - run, run);
    tok_buf_putc(b, '"');
}

/* repr() of a finite double. */
static void put_float(struct tok_buf *b, double x)
{
    char buf[40];
    int  p;
    for (p = 1; p < 17; p++) {
        snprintf(buf, sizeof(buf), "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    snprintf(buf, sizeof(buf), "%.*e", p - 1, x);
    /* buf is [-]d[.ddd]e(+|-)XX: collect the digits and the decimal exponent */
    const char *q = buf;
    if (*q == '-') {
        tok_buf_putc(b, '-');
        q++;
    }
    char digits[24];
    int  nd = 0;
    while (*q && *q != 'e') {
        if (*q != '.') digits[nd++] = *q;
        q++;
    }
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--; /* p is minimal, but "0e+00" style zeros */
    int decpt = exp10 + 1;                        /* value = 0.DIGITS x 10^decpt */
    if (decpt <= -4 || decpt > 16) {
        tok_buf_putc(b, digits[0]);
        if (nd > 1) {
            tok_buf_putc(b, '.');
            tok_buf_put(b, digits + 1, (size_t)nd - 1);
        }
        char e[16];
        snprintf(e, sizeof(e), "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        tok_buf_puts(b, e);
    } else if (decpt <= 0) {
        tok_buf_puts(b, "0.");
        for (int i = 0; i < -decpt; i++) tok_buf_putc(b, '0');
        tok_buf_put(b, digits, (size_t)nd);
    } else if (decpt >= nd) {
        tok_buf_put(b, digits, (size_t)nd);
        for (int i = nd; i < decpt; i++) tok_buf_putc(b, '0');
        tok_buf_puts(b, ".0");
    } else {
        tok_buf_put(b, digits, (size_t)decpt);
        tok_buf_putc(b, '.');
        tok_buf_put(b, digits + decpt, (size_t)(nd - decpt));
    }
}

int tok_pyjson_dump(struct tok_buf *b, const json_t *v, struct dsv4_err *err)
{
    char        num[32];
    size_t      i;
    const char *key;
    json_t     *item;
    int         rc;
    switch (json_typeof(v)) {
    case JSON_NULL: tok_buf_puts(b, "null"); return DSV4_OK;
    case JSON_TRUE: tok_buf_puts(b, "true"); return DSV4_OK;
    case JSON_FALSE: tok_buf_puts(b, "false"); return DSV4_OK;
    case JSON_INTEGER:
        snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(v));
        tok_buf_puts(b, num);
        return DSV4_OK;
    case JSON_REAL:
        if (!isfinite(json_real_value(v))) return dsv4_err_set(err, DSV4_EINVAL, "JSON value is not a finite number");
        put_float(b, json_real_value(v));
        return DSV4_OK;
    case JSON_STRING: tok_pyjson_string(b, json_string_value(v), json_string_length(v)); return DSV4_OK;
    case JSON_ARRAY:
        tok_buf_putc(b, '[');
        json_array_foreach((json_t *)v, i, item) {
            if (i) tok_buf_puts(b, ", ");
            if ((rc = tok_pyjson_dump(b, item, err))) return rc;
        }
        tok_buf_putc(b, ']');
        return DSV4_OK;
    case JSON_OBJECT:
        tok_buf_putc(b, '{');
        i = 0;
        json_object_foreach((json_t *)v, key, item) {
            if (i++) tok_buf_puts(b, ", ");
            tok_pyjson_string(b, key, strlen(key));
            tok_buf_puts(b, ": ");
            if ((rc = tok_pyjson_dump(b, item, err))) return rc;
        }
        tok_buf_putc(b, '}');
        return DSV4_OK;
    }
    return dsv4_err_set(err, DSV4_EINTERNAL, "unknown JSON type");
}
