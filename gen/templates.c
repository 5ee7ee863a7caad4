/*
 * templates.c - looks up the embedded CUDA C templates by file name.
 */
#include "gen/templates.h"

#include <string.h>

const w16_embedded_template_t *w16_template_find(const char *name)
{
    size_t n = strlen(name);
    for (const w16_embedded_template_t *t = w16_embedded_templates; t->origin;
         t++) {
        size_t o = strlen(t->origin);
        if (o > n && t->origin[o - n - 1] == '/' &&
            strcmp(t->origin + o - n, name) == 0)
            return t;
    }
    return NULL;
}
