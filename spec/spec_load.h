/*
 * spec_load.h - the one door of the loader (spec_load.c) that only the
 * registry (spec_registry.c) may use: parsing a built-in spec without the
 * layout check on its first sample. Private to spec/.
 */
#ifndef W16_SPEC_LOAD_H
#define W16_SPEC_LOAD_H

#include "spec/spec.h"

/* w16_spec_parse without the check of the layouts on the first sample
 * problem: built-in specs skip it at load (it costs tens of milliseconds
 * per spec and the test suite checks them in full); every spec from a
 * file or the API is checked. Caller frees with w16_spec_free. */
wna16_status_t w16_spec_parse_builtin(wna16_context_t *ctx,
                                      const char *origin, const char *text,
                                      size_t len, wna16_spec_t **out,
                                      wna16_error_t *err);

#endif /* W16_SPEC_LOAD_H */
