/*
 * spirv_validate.c - SPIRV-Tools' validator and disassembler through its C
 * API (see spirv_validate.h). Debian ships SPIRV-Tools as a static C++
 * library only, linked with -lstdc++ (CMake: SPIRV-Tools-static); a build
 * without it compiles the stubs at the bottom, which refuse with the
 * package to install. A context is made per call: it costs well under a
 * millisecond, and wna16 keeps no globals.
 */
#include "gen/spirv_validate.h"

#ifdef WNA16_HAVE_SPIRV_TOOLS
#include <spirv-tools/libspirv.h>

#include <stdio.h>
#include <string.h>

/* The environment every module is validated for: OpenCL 2.2 accepts
 * SPIR-V 1.0 to 1.2 with the Kernel capability; the OpenCL 1.2 and 2.0
 * environments demand SPIR-V 1.0. */
#define W16_SPIRV_ENV SPV_ENV_OPENCL_2_2

wna16_status_t w16_spirv_validate(const uint32_t *words, size_t n,
                                  const char *kernel, wna16_error_t *err)
{
    spv_context c = spvContextCreate(W16_SPIRV_ENV);
    if (!c)
        return w16_err(err, WNA16_ENOMEM, "kernel %s: cannot create a "
                       "SPIRV-Tools context", kernel);
    spv_const_binary_t bin = {words, n};
    spv_diagnostic diag = NULL;
    spv_result_t r = spvValidate(c, &bin, &diag);
    wna16_status_t st = WNA16_OK;
    if (r != SPV_SUCCESS) {
        /* the message on one line: the validator prints the instruction
         * it means on an indented line of its own */
        char msg[sizeof err->message];
        const char *from = diag && diag->error ? diag->error : "no diagnostic";
        size_t o = 0;
        for (const char *p = from; *p && o + 2 < sizeof msg; p++) {
            if (*p != '\n') {
                msg[o++] = *p;
                continue;
            }
            while (p[1] == ' ')
                p++;
            if (p[1]) {
                msg[o++] = ';';
                msg[o++] = ' ';
            }
        }
        msg[o] = '\0';
        /* position.index: the instruction (1 = the first after the header),
         * 0 where the finding is about the whole module */
        if (diag && diag->position.index)
            st = w16_err(err, WNA16_EINTERNAL, "kernel %s: SPIR-V validation "
                         "failed at instruction %zu: %s", kernel,
                         diag->position.index, msg);
        else
            st = w16_err(err, WNA16_EINTERNAL, "kernel %s: SPIR-V validation "
                         "failed: %s", kernel, msg);
    }
    spvDiagnosticDestroy(diag);
    spvContextDestroy(c);
    return st;
}

wna16_status_t w16_spirv_disassemble(const uint32_t *words, size_t n,
                                     const char *kernel, w16_buf_t *out,
                                     wna16_error_t *err)
{
    spv_context c = spvContextCreate(W16_SPIRV_ENV);
    if (!c)
        return w16_err(err, WNA16_ENOMEM, "kernel %s: cannot create a "
                       "SPIRV-Tools context", kernel);
    spv_text text = NULL;
    spv_diagnostic diag = NULL;
    spv_result_t r = spvBinaryToText(c, words, n,
                                     SPV_BINARY_TO_TEXT_OPTION_FRIENDLY_NAMES |
                                         SPV_BINARY_TO_TEXT_OPTION_INDENT,
                                     &text, &diag);
    wna16_status_t st = WNA16_OK;
    if (r != SPV_SUCCESS)
        st = w16_err(err, WNA16_EINTERNAL, "kernel %s: SPIR-V disassembly "
                     "failed: %s", kernel,
                     diag && diag->error ? diag->error : "no diagnostic");
    else
        w16_buf_append(out, text->str, text->length);
    spvTextDestroy(text);
    spvDiagnosticDestroy(diag);
    spvContextDestroy(c);
    if (st == WNA16_OK && out->failed)
        return w16_err_nomem(err, "printing SPIR-V");
    return st;
}

const char *w16_spirv_tools_version(void)
{
    return spvSoftwareVersionDetailsString();
}

#else /* no SPIRV-Tools */

#define W16_NO_SPIRV_TOOLS "this build has no SPIRV-Tools (install spirv-tools " \
                           "and spirv-headers and reconfigure)"

wna16_status_t w16_spirv_validate(const uint32_t *words, size_t n,
                                  const char *kernel, wna16_error_t *err)
{
    (void)words;
    (void)n;
    return w16_err(err, WNA16_EUNAVAILABLE, "kernel %s: cannot validate "
                   "SPIR-V: %s", kernel, W16_NO_SPIRV_TOOLS);
}

wna16_status_t w16_spirv_disassemble(const uint32_t *words, size_t n,
                                     const char *kernel, w16_buf_t *out,
                                     wna16_error_t *err)
{
    (void)words;
    (void)n;
    (void)out;
    return w16_err(err, WNA16_EUNAVAILABLE, "kernel %s: cannot print "
                   "SPIR-V: %s", kernel, W16_NO_SPIRV_TOOLS);
}

const char *w16_spirv_tools_version(void) { return "none"; }

#endif
