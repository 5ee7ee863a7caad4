/*
 * cli_util.c - helpers shared by the subcommands (see cli.h).
 */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

bool cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "wna16 %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'wna16 %s --help'.\n", cmd);
    return CLI_USAGE;
}

int cli_target(const char *cmd, const char *value, bool reference_ok,
               wna16_target_t *out)
{
    int first = reference_ok ? WNA16_TARGET_REFERENCE : WNA16_TARGET_REFERENCE + 1;
    char choices[160] = "";
    for (int t = first; t < WNA16_TARGET_COUNT_; t++) {
        const char *name = wna16_target_name((wna16_target_t)t);
        if (value && strcmp(value, name) == 0) {
            *out = (wna16_target_t)t;
            return CLI_OK;
        }
        size_t n = strlen(choices);
        snprintf(choices + n, sizeof choices - n, "%s%s",
                 t == first ? "" : t + 1 == WNA16_TARGET_COUNT_ ? " or " : ", ",
                 name);
    }
    if (!value)
        return cli_usage_error(cmd, "--target needs %s", choices);
    return cli_usage_error(cmd, "--target: '%s' is not %s", value, choices);
}

/* The command's last failure, for a --json report (one command a process,
 * one thread reporting). */
static wna16_error_t last_error;
static bool have_last_error;

const wna16_error_t *cli_last_error(void)
{
    return have_last_error ? &last_error : NULL;
}

int cli_fail(const wna16_error_t *err)
{
    last_error = *err;
    have_last_error = true;
    fprintf(stderr, "wna16: %s\n", err->message[0] ? err->message
                                                   : wna16_status_text(err->status));
    return CLI_FAIL;
}

bool cli_opt_value(int argc, char **argv, int *i, const char *name,
                   const char **value)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return false;
    if (a[n] == '=') {
        *value = a + n + 1;
        return true;
    }
    if (a[n] != '\0')
        return false;
    if (*i + 1 < argc) {
        *value = argv[++*i];
    } else {
        *value = NULL;
    }
    return true;
}

bool cli_parse_int(const char *s, long lo, long hi, long *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

void cli_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

wna16_context_t *cli_context(void)
{
    wna16_context_t *ctx = NULL;
    wna16_error_t err;
    if (wna16_context_create(NULL, &ctx, &err) != WNA16_OK) {
        cli_fail(&err);
        return NULL;
    }
    return ctx;
}

int cli_json_fail(FILE *f, const wna16_error_t *err)
{
    fputs("{\"ok\": false, \"error\": {\"status\": ", f);
    cli_json_string(f, wna16_status_name(err->status));
    fputs(", \"message\": ", f);
    cli_json_string(f, err->message[0] ? err->message
                                       : wna16_status_text(err->status));
    fputs("}}\n", f);
    return CLI_FAIL;
}
