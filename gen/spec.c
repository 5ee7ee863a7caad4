/* placeholder registry while the loader is written */
#include "gen/spec.h"
wna16_status_t w16_specs_init(wna16_context_t *ctx, bool builtin,
                              const char *dir, wna16_error_t *err)
{ (void)ctx; (void)builtin; (void)dir; (void)err; return WNA16_OK; }
void w16_specs_fini(wna16_context_t *ctx) { (void)ctx; }
