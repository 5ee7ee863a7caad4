/*
 * json_text.c - the strict byte-level check of a JSON text (json_text.h):
 * UTF-8 validity, control characters, the JSON number grammar and \u0000,
 * in one pass without allocating.
 */
#include "base/json_text.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Length of the UTF-8 sequence at s[0..len) (1 for ASCII), 0 if invalid:
 * overlong forms, surrogates and code points past U+10FFFF are refused. */
static size_t utf8_seq(const unsigned char *s, size_t len)
{
    unsigned c = s[0], min, cp;
    size_t n;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 1, min = 0x80, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
        n = 2, min = 0x800, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
        n = 3, min = 0x10000, cp = c & 0x07;
    else
        return 0;
    if (len <= n)
        return 0;
    for (size_t k = 1; k <= n; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n + 1;
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* Length of the JSON number at s[0..len) if it follows the JSON grammar
 * (cJSON also takes "01" or "1."), 0 if not. */
static size_t json_number_len(const unsigned char *s, size_t len)
{
    size_t i = s[0] == '-';
    if (i < len && s[i] == '0')
        i++;
    else if (i < len && is_digit(s[i]))
        while (i < len && is_digit(s[i]))
            i++;
    else
        return 0;
    if (i < len && s[i] == '.') {
        if (++i >= len || !is_digit(s[i]))
            return 0;
        while (i < len && is_digit(s[i]))
            i++;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        if (++i < len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= len || !is_digit(s[i]))
            return 0;
        while (i < len && is_digit(s[i]))
            i++;
    }
    if (i < len && (is_digit(s[i]) || s[i] == '.' || s[i] == 'e' ||
                    s[i] == 'E' || s[i] == '+' || s[i] == '-'))
        return 0;
    return i;
}

w16_json_fault_t w16_json_text_check(const char *text, size_t len,
                                     size_t *at)
{
    const unsigned char *s = (const unsigned char *)text;
    *at = 0;
    bool in_str = false;
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        size_t n = utf8_seq(s + i, len - i);
        *at = i;
        if (!n || (c < 0x20 && (in_str || (c != '\t' && c != '\n' &&
                                           c != '\r'))))
            return W16_JSON_BYTE;
        if (in_str && c == '\\' && i + 1 < len) {
            if (len - i >= 6 && memcmp(s + i + 1, "u0000", 5) == 0)
                return W16_JSON_NUL;
            n = 2; /* the escaped byte cannot end the string */
        } else if (c == '"') {
            in_str = !in_str;
        } else if (!in_str && (c == '-' || is_digit(c))) {
            n = json_number_len(s + i, len - i);
            if (!n)
                return W16_JSON_NUMBER;
        }
        i += n;
    }
    return W16_JSON_OK;
}

const char *w16_json_fault_str(w16_json_fault_t f, const char *text,
                               size_t at, char *buf, size_t cap)
{
    switch (f) {
    case W16_JSON_OK:
        snprintf(buf, cap, "valid JSON text");
        break;
    case W16_JSON_BYTE:
        snprintf(buf, cap, "byte %zu (0x%02x) is not valid in JSON text", at,
                 (unsigned char)text[at]);
        break;
    case W16_JSON_NUMBER:
        snprintf(buf, cap, "byte %zu: malformed JSON number", at);
        break;
    case W16_JSON_NUL:
        snprintf(buf, cap, "byte %zu: \\u0000 is not allowed", at);
        break;
    }
    return buf;
}
