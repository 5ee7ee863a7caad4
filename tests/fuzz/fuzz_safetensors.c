/*
 * fuzz_safetensors.c - libFuzzer harness for the safetensors reader: every
 * input is a whole file given to wna16_safetensors_open_memory (the same
 * strict header validation as a file). A refusal must carry a non-OK
 * status and a message; an accepted file is read in full: every tensor's
 * name, dtype, shape and every byte of its data (which the reader
 * promised lie inside the buffer: ASan sees any that do not), the lookup
 * by name, and the metadata. Built with clang-19 -fsanitize=fuzzer by
 * tests/fuzz/build.sh.
 */
#include "wna16.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static wna16_context_t *ctx;

static void breach(const char *what, const wna16_error_t *e)
{
    fprintf(stderr, "fuzz_safetensors: %s (status %s, message \"%s\")\n",
            what, wna16_status_name(e->status), e->message);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR,
                                 .log_level_set = true,
                                 .no_builtin_specs = true};
    wna16_error_t err;
    if (wna16_context_create(&o, &ctx, &err) != WNA16_OK)
        breach("no context", &err);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wna16_safetensors_t *st = NULL;
    wna16_error_t err;
    memset(&err, 0, sizeof err);
    wna16_status_t s = wna16_safetensors_open_memory(ctx, "fuzz", data, size,
                                                     &st, &err);
    if (s != WNA16_OK) {
        if (st || !err.message[0] || err.status != s)
            breach("a refusal without a message, or with a reader", &err);
        return 0;
    }
    volatile unsigned sum = 0;
    size_t n = wna16_safetensors_count(st);
    for (size_t i = 0; i < n; i++) {
        const wna16_tensor_t *t = wna16_safetensors_at(st, i);
        if (!t || wna16_safetensors_find(st, t->name) != t)
            breach("a tensor that its name does not find", &err);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel *= (uint64_t)t->shape[d];
        size_t bytes = 0;
        if (!wna16_dtype_nbytes(t->dtype, numel, &bytes) || bytes != t->nbytes)
            breach("a tensor whose size is not its shape's", &err);
        const uint8_t *p = t->data;
        for (size_t b = 0; b < t->nbytes; b++)
            sum += p[b];
    }
    for (size_t i = 0; i < wna16_safetensors_metadata_count(st); i++) {
        const char *k = wna16_safetensors_metadata_key(st, i);
        const char *v = k ? wna16_safetensors_metadata_get(st, k) : NULL;
        if (!k || !v)
            breach("a metadata key without its value", &err);
        sum += (unsigned)strlen(k) + (unsigned)strlen(v);
    }
    wna16_safetensors_close(st);
    return 0;
}
