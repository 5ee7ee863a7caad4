/*
 * templates.h - the hand-written CUDA C kernel skeletons of templates/,
 * compiled into the library (cmake/embed.cmake) and specialized by the
 * generator (gen/moe_cuda.c), so an installed wna16 needs no template
 * directory.
 */
#ifndef W16_TEMPLATES_H
#define W16_TEMPLATES_H

#include <stddef.h>

typedef struct w16_embedded_template {
    const char *origin; /* "builtin:templates/moe_marlin_gemm.cu" */
    const char *text;   /* NUL-terminated */
    size_t len;
} w16_embedded_template_t;

/* Ends with a {NULL, NULL, 0} row. */
extern const w16_embedded_template_t w16_embedded_templates[];

/* The template whose file name is `name` ("moe_marlin_gemm.cu"); NULL if
 * the build has none. */
const w16_embedded_template_t *w16_template_find(const char *name);

#endif
