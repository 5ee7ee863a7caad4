/*
 * cmd_cache.c - `wna16 cache stats | clear`: how many compiled kernels the
 * on-disk kernel cache holds, how much space they take against its size
 * limit (and where that limit comes from), or remove them. The directory
 * is --dir, else the one the library would use ($WNA16_CACHE_DIR,
 * $XDG_CACHE_HOME/wna16, ~/.cache/wna16); the limit is the one the library
 * would apply ($WNA16_CACHE_MAX_SIZE, else the default). Only the cache's
 * own files are counted or removed (runtime/cache/cache.c decides which
 * those are), so pointing --dir at the wrong place is harmless. stats also
 * says when the library would refuse the directory (not the user's alone).
 */
#include "cli.h"
#include "runtime/cache/cache.h"

#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: wna16 cache stats [--dir DIR] [--json]\n"
        "       wna16 cache clear [--dir DIR]\n\n"
        "stats  the cache directory, its number of entries, their size and\n"
        "       the size limit (when a write goes over it, the least recently\n"
        "       used entries are removed down to 90%% of it)\n"
        "clear  remove every entry (and temporary files left by writers that\n"
        "       died); other files and the directories stay\n\n"
        "--dir DIR  the cache directory; default $WNA16_CACHE_DIR, else\n"
        "           $XDG_CACHE_HOME/wna16, else $HOME/.cache/wna16\n"
        "--json     print one JSON object: directory, entries, bytes, limit\n"
        "           (null: none), limit_source (default, env), untrusted\n"
        "           (null, or why the library refuses the directory)\n\n"
        "The limit is $WNA16_CACHE_MAX_SIZE (bytes, or with a K, M, G or T\n"
        "suffix; 0 for none), else 2 GiB; a program may set its own.\n");
}

/* Parses [--dir DIR] (and [--json] where json is not NULL) after the
 * subcommand; the directory goes to dir[n]. */
static int parse_args(const char *cmd, int argc, char **argv, char *dir,
                      size_t n, bool *json)
{
    const char *given = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (json && strcmp(argv[i], "--json") == 0) {
            *json = true;
            continue;
        }
        if (!cli_opt_value(argc, argv, &i, "--dir", &v))
            return cli_usage_error(cmd, "unknown option '%s'", argv[i]);
        if (!v || !*v)
            return cli_usage_error(cmd, "--dir needs a value");
        given = v;
    }
    if (given) {
        if ((size_t)snprintf(dir, n, "%s", given) >= n)
            return cli_usage_error(cmd, "--dir: path too long");
        return CLI_OK;
    }
    if (w16_cache_default_dir(dir, n) != WNA16_OK) {
        fprintf(stderr, "wna16: no cache directory: set WNA16_CACHE_DIR or "
                        "HOME, or pass --dir\n");
        return CLI_FAIL;
    }
    return CLI_OK;
}

/* "512 bytes", or "1.5 KiB (1536 bytes)": readable, and exact for scripts. */
static void human_size(uint64_t bytes, char *out, size_t n)
{
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(out, n, "%llu bytes", (unsigned long long)bytes);
    else
        snprintf(out, n, "%.1f %s (%llu bytes)", v, units[u],
                 (unsigned long long)bytes);
}

/* ORDER LIMIT_SOURCE: how the text report names where the limit is from. */
static const char *source_words(w16_cache_limit_source_t s)
{
    switch (s) {
    case W16_CACHE_LIMIT_ENV:
        return "from $WNA16_CACHE_MAX_SIZE";
    case W16_CACHE_LIMIT_OPTION:
        return "from the program's options";
    case W16_CACHE_LIMIT_DEFAULT:
        break;
    }
    return "the default";
}

static int cache_stats(int argc, char **argv)
{
    char dir[4096];
    bool json = false;
    int rc = parse_args("cache stats", argc, argv, dir, sizeof dir, &json);
    if (rc != CLI_OK)
        return rc;
    size_t files = 0;
    uint64_t bytes = 0, limit;
    w16_cache_limit_source_t source;
    wna16_error_t err;
    if (w16_cache_limit(0, &limit, &source, &err) != WNA16_OK ||
        w16_cache_dir_stats(dir, &files, &bytes, &err) != WNA16_OK)
        return cli_fail(&err);
    char why[128];
    bool refused = w16_cache_dir_refused(dir, why, sizeof why);
    bool unlimited = limit == WNA16_CACHE_UNLIMITED;
    if (json) {
        printf("{\"directory\": ");
        cli_json_string(stdout, dir);
        printf(", \"entries\": %zu, \"bytes\": %llu, \"limit\": ", files,
               (unsigned long long)bytes);
        if (unlimited)
            printf("null");
        else
            printf("%llu", (unsigned long long)limit);
        printf(", \"limit_source\": \"%s\", \"untrusted\": ",
               w16_cache_limit_source_name(source));
        if (refused)
            cli_json_string(stdout, why);
        else
            printf("null");
        printf("}\n");
        return CLI_OK;
    }
    char size[64], lim[64];
    human_size(bytes, size, sizeof size);
    human_size(limit, lim, sizeof lim);
    printf("directory: %s\nentries:   %zu\nsize:      %s\nlimit:     %s, %s\n",
           dir, files, size, unlimited ? "none" : lim, source_words(source));
    if (refused)
        printf("untrusted: %s: the library caches in memory only\n", why);
    return CLI_OK;
}

static int cache_clear(int argc, char **argv)
{
    char dir[4096];
    int rc = parse_args("cache clear", argc, argv, dir, sizeof dir, NULL);
    if (rc != CLI_OK)
        return rc;
    size_t removed = 0;
    wna16_error_t err;
    wna16_status_t st = w16_cache_clear(dir, &removed, &err);
    /* One error for a failure; what went before it is reported too, since
     * those files are gone. */
    if (st == WNA16_OK || removed)
        printf("removed %zu %s from %s\n", removed,
               removed == 1 ? "entry" : "entries", dir);
    return st == WNA16_OK ? CLI_OK : cli_fail(&err);
}

int cmd_cache(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
    if (strcmp(argv[1], "stats") == 0)
        return cache_stats(argc - 1, argv + 1);
    if (strcmp(argv[1], "clear") == 0)
        return cache_clear(argc - 1, argv + 1);
    return cli_usage_error("cache", "unknown subcommand '%s' (stats, clear)",
                           argv[1]);
}
