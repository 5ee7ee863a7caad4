/*
 * json_text.h - the bytes of a JSON text checked before cJSON parses it.
 * cJSON is lenient where JSON is not: it takes raw control characters as
 * whitespace and inside strings, invalid UTF-8, numbers such as "01" or
 * "1.", and \u0000 that silently cuts a C string short. Every JSON the
 * library reads (safetensors headers, config.json, index files, specs,
 * manifests) is untrusted and goes through this check first, so the
 * readers all refuse the same texts, naming the offending byte.
 */
#ifndef W16_JSON_TEXT_H
#define W16_JSON_TEXT_H

#include <stddef.h>

typedef enum w16_json_fault {
    W16_JSON_OK,
    W16_JSON_BYTE,   /* a control character or invalid UTF-8 */
    W16_JSON_NUMBER, /* a number outside the JSON grammar */
    W16_JSON_NUL,    /* \u0000: would cut a C string short */
} w16_json_fault_t;

/* Checks text[0..len); on a fault *at is the byte offset of its start. */
w16_json_fault_t w16_json_text_check(const char *text, size_t len,
                                     size_t *at);

/* "byte 12 (0x01) is not valid in JSON text", "byte 7: malformed JSON
 * number", "byte 3: \u0000 is not allowed" into buf (cap bytes). */
const char *w16_json_fault_str(w16_json_fault_t f, const char *text,
                               size_t at, char *buf, size_t cap);

#endif /* W16_JSON_TEXT_H */
