/*
 * fuzz_config.c - libFuzzer harness for config.json: every input is
 * written to one temporary file (the reader takes a path) and read with
 * wna16_model_config_load; an accepted config then goes through
 * wna16_model_config_quant. A refusal must carry a non-OK status and a
 * message naming the file; an accepted config's strings must be
 * terminated within their fields. Built with clang-19 -fsanitize=fuzzer by
 * tests/fuzz/build.sh.
 */
#define _POSIX_C_SOURCE 200809L
#include "wna16.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[256];
static int fd = -1;

static void breach(const char *what, const wna16_error_t *e)
{
    fprintf(stderr, "fuzz_config: %s (status %s, message \"%s\")\n", what,
            wna16_status_name(e->status), e->message);
    abort();
}

static void remove_file(void)
{
    if (fd >= 0)
        unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/wna16_fuzz_config_XXXXXX",
             dir && *dir ? dir : "/tmp");
    fd = mkstemp(path);
    if (fd < 0) {
        perror("fuzz_config: mkstemp");
        abort();
    }
    atexit(remove_file);
    return 0;
}

static bool terminated(const char *s, size_t n)
{
    return memchr(s, '\0', n) != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) {
        perror("fuzz_config: writing the input");
        abort();
    }
    wna16_model_config_t cfg;
    wna16_error_t err;
    memset(&err, 0, sizeof err);
    wna16_status_t s = wna16_model_config_load(path, &cfg, &err);
    if (s != WNA16_OK) {
        if (err.status != s || !strstr(err.message, path))
            breach("a refusal whose message does not name the file", &err);
        return 0;
    }
    if (!terminated(cfg.model_type, sizeof cfg.model_type) ||
        !terminated(cfg.torch_dtype, sizeof cfg.torch_dtype) ||
        !terminated(cfg.quant_method, sizeof cfg.quant_method) ||
        !terminated(cfg.actorder, sizeof cfg.actorder) ||
        !terminated(cfg.format_name, sizeof cfg.format_name) ||
        !terminated(cfg.version, sizeof cfg.version) ||
        !terminated(cfg.linear_quant_method, sizeof cfg.linear_quant_method))
        breach("a string field without its terminator", &err);
    wna16_quant_desc_t q;
    memset(&err, 0, sizeof err);
    s = wna16_model_config_quant(&cfg, &q, &err);
    if (s != WNA16_OK && (!err.message[0] || err.status != s))
        breach("a quantization refusal without a message", &err);
    return 0;
}
