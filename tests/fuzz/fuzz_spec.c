/*
 * fuzz_spec.c - libFuzzer harness for the spec loader: every input is a
 * spec text given to wna16_spec_load_text on a fresh context without the
 * built-in specs (parsing, validation, the layout proofs on sample
 * problems). Besides the sanitizers' findings, a crash is any breach of
 * the loader's contract: a refusal must be WNA16_ESPEC or WNA16_EINVAL
 * with a message that starts with the origin, and leave the registry
 * empty; an accepted spec is the one registered and answers its
 * accessors; a refusal's error record carries the status returned. Built
 * with clang-19 -fsanitize=fuzzer by tests/fuzz/build.sh.
 */
#include "wna16.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ORIGIN "fuzz"

static void breach(const char *what, const wna16_error_t *e)
{
    fprintf(stderr, "fuzz_spec: %s (status %s, message \"%s\")\n", what,
            wna16_status_name(e->status), e->message);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR,
                                 .log_level_set = true,
                                 .no_builtin_specs = true};
    wna16_context_t *ctx = NULL;
    wna16_error_t err;
    memset(&err, 0, sizeof err);
    if (wna16_context_create(&o, &ctx, &err) != WNA16_OK)
        breach("no context", &err);
    const wna16_spec_t *spec = NULL;
    wna16_status_t st = wna16_spec_load_text(ctx, ORIGIN, (const char *)data,
                                             size, &spec, &err);
    if (st == WNA16_OK) {
        if (!spec || wna16_spec_count(ctx) != 1 ||
            wna16_spec_at(ctx, 0) != spec)
            breach("an accepted spec is not the one registered", &err);
        const char *name = wna16_spec_name(spec);
        if (!name || !*name ||
            wna16_spec_find(ctx, wna16_spec_kind(spec), name) != spec)
            breach("an accepted spec cannot be found by its name", &err);
        (void)wna16_spec_title(spec);
        (void)wna16_spec_description(spec);
        (void)wna16_spec_origin(spec);
    } else {
        size_t lo = strlen(ORIGIN);
        if (st != err.status)
            breach("the status returned is not the error's", &err);
        if (st != WNA16_ESPEC && st != WNA16_EINVAL)
            breach("a refusal that is not ESPEC or EINVAL", &err);
        if (strncmp(err.message, ORIGIN, lo) != 0 || err.message[lo] != ':')
            breach("a refusal whose message does not start with the origin",
                   &err);
        if (wna16_spec_count(ctx) != 0)
            breach("a refused spec was registered", &err);
    }
    wna16_context_destroy(ctx);
    return 0;
}
