/*
 * cli.h - shared pieces of the `wna16` command line: subcommand entry
 * points, option parsing helpers and exit codes.
 *
 * Exit codes: 0 success; 1 the operation failed or was refused (the error
 * is printed); 2 usage error (bad flags; the usage line is printed).
 */
#ifndef WNA16_CLI_H
#define WNA16_CLI_H

#include "wna16.h"

#include <stdbool.h>
#include <stdio.h>

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* Subcommands: argv[0] is the subcommand name. */
int cmd_specs(int argc, char **argv);
int cmd_select(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_gen(int argc, char **argv);
/* `wna16 gen --kind moe --target cuda` (cmd_gen dispatches to it). */
int cmd_gen_moe_cuda(int argc, char **argv);
int cmd_repack(int argc, char **argv);
int cmd_cache(int argc, char **argv);
int cmd_fuzz(int argc, char **argv);
int cmd_pack(int argc, char **argv);

/* Is argv[i] "-h" or "--help"? */
bool cli_is_help(const char *arg);

/* Prints "wna16 <cmd>: <message>" and the hint to use --help; returns
 * CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prints "wna16: <message>" for a failed library call; returns CLI_FAIL.
 * The error is also kept as the command's last (cli_last_error). */
int cli_fail(const wna16_error_t *err);
/* The last error cli_fail printed in this process, or NULL. */
const wna16_error_t *cli_last_error(void);

/* Option parsing: matches "--name VALUE" or "--name=VALUE" at argv[*i];
 * advances *i past the value. Returns true on a match; *value NULL when
 * the value is missing (a usage error for the caller to report). */
bool cli_opt_value(int argc, char **argv, int *i, const char *name,
                   const char **value);
/* Parses a decimal int in [lo, hi]; false if malformed. */
bool cli_parse_int(const char *s, long lo, long hi, long *out);

/* Parses a --target value: a target's name ("cpu", "cuda"; whether this
 * build and machine have it is asked later, of the target list), or
 * "reference" where `reference_ok`. Prints the usage error naming the
 * choices and returns CLI_USAGE when it is none of them. */
int cli_target(const char *cmd, const char *value, bool reference_ok,
               wna16_target_t *out);

/* Writes s as a JSON string (quoted, escaped). */
void cli_json_string(FILE *f, const char *s);
/* The failure of a command run with --json, as one object on its own
 * line: {"ok": false, "error": {"status": "EUNSUPPORTED", "message":
 * "..."}}; returns CLI_FAIL. */
int cli_json_fail(FILE *f, const wna16_error_t *err);

/* A context with the built-in specs (and $WNA16_SPEC_DIR); prints the error
 * and returns NULL on failure. */
wna16_context_t *cli_context(void);

#endif
