/* SPDX-License-Identifier: Apache-2.0 */
/* Rendering for `-o json|yaml|table`: a byte-preserving JSON re-indenter, a JSON-to-YAML
 * emitter, aligned tables, and kubectl's AGE. Pure: everything goes into a struct buf. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"

int cli_output_parse(enum cli_output *out, const char *s, struct err *err)
{
    static const struct {
        const char *name;
        enum cli_output value;
    } formats[] = {
        {"table", CLI_OUTPUT_TABLE}, {"json", CLI_OUTPUT_JSON}, {"yaml", CLI_OUTPUT_YAML}};

    for (size_t i = 0; i < ARRAY_LEN(formats); i++) {
        if (strcmp(s, formats[i].name) == 0) {
            *out = formats[i].value;
            return E_OK;
        }
    }
    return err_set(err, E_INVALID, "unknown output format \"%s\" (want table, json or yaml)", s);
}

/* buf_* fail only past a cap, and the output buffers here have none. */
static void put(struct buf *b, const char *s, size_t n)
{
    int rc = buf_append(b, s, n);
    ASSERT(rc == E_OK);
}

static void puts_(struct buf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void newline_indent(struct buf *b, int depth)
{
    put(b, "\n", 1);
    for (int i = 0; i < depth; i++) {
        put(b, "  ", 2);
    }
}

static size_t skip_ws(const char *t, size_t i, size_t len)
{
    while (i < len && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) {
        i++;
    }
    return i;
}

/* Index of the quote closing the string that opens at T[I]. */
static size_t string_end(const char *t, size_t i, size_t len)
{
    size_t j = i + 1;

    while (j < len && t[j] != '"') {
        j += (t[j] == '\\') ? 2 : 1;
    }
    return j < len ? j : len - 1;
}

/* Writes the bracket at T[I]; an empty pair stays "{}"/"[]". Returns the index of the
 * last byte consumed. */
static size_t open_bracket(struct buf *out, const char *t, size_t i, size_t len, int *depth)
{
    size_t next = skip_ws(t, i + 1, len);

    put(out, t + i, 1);
    if (next < len && (t[next] == '}' || t[next] == ']')) {
        put(out, t + next, 1);
        return next;
    }
    newline_indent(out, ++*depth);
    return i;
}

void cli_json_pretty(struct buf *out, const char *t, size_t len)
{
    int depth = 0;

    for (size_t i = 0; i < len; i++) {
        size_t j;
        switch (t[i]) {
        case '"':
            j = string_end(t, i, len);
            put(out, t + i, j - i + 1);
            i = j;
            break;
        case '{':
        case '[':
            i = open_bracket(out, t, i, len, &depth);
            break;
        case '}':
        case ']':
            depth = depth > 0 ? depth - 1 : 0;
            newline_indent(out, depth);
            put(out, t + i, 1);
            break;
        case ',':
            put(out, ",", 1);
            newline_indent(out, depth);
            break;
        case ':':
            put(out, ": ", 2);
            break;
        case ' ':
        case '\t':
        case '\n':
        case '\r':
            break;
        default:
            put(out, t + i, 1);
            break;
        }
    }
    put(out, "\n", 1);
}

static bool starts_like_number(const char *s)
{
    const char *p = s + ((*s == '-' || *s == '+') ? 1 : 0);
    return (*p >= '0' && *p <= '9') || *p == '.';
}

bool cli_yaml_needs_quotes(const char *s)
{
    /* YAML 1.1 and 1.2 null/bool spellings (compared case-insensitively). */
    static const char *const words[] = {"null", "~",  "true", "false", "yes",
                                        "no",   "on", "off",  "y",     "n"};
    size_t len = strlen(s);

    if (len == 0 || s[0] == ' ' || s[len - 1] == ' ' || s[len - 1] == ':') {
        return true;
    }
    if (strchr("-?:,[]{}#&*!|>'\"%@`", s[0]) != NULL || starts_like_number(s)) {
        return true;
    }
    if (strstr(s, ": ") != NULL || strstr(s, " #") != NULL) {
        return true;
    }
    for (size_t i = 0; i < ARRAY_LEN(words); i++) {
        if (strcasecmp(s, words[i]) == 0) {
            return true;
        }
    }
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p < 0x20 || *p >= 0x7f) {
            return true; /* control characters, and any non-ASCII to be safe */
        }
    }
    return false;
}

/* The escape for the ASCII byte C, or NULL when it goes out as it is. ESC (SIZE bytes, at
 * least 5) holds a \xNN escape. */
static const char *ascii_escape(unsigned char c, char *esc, size_t size)
{
    switch (c) {
    case '"':
        return "\\\"";
    case '\\':
        return "\\\\";
    case '\n':
        return "\\n";
    case '\t':
        return "\\t";
    default:
        break;
    }
    if (c < 0x20 || c == 0x7f) {
        snprintf(esc, size, "\\x%02X", c);
        return esc;
    }
    return NULL;
}

/* The escape for the UTF-8 line break (NEL, LS, PS) or byte order mark at P, its length in
 * *LEN; NULL when P starts none of them. */
static const char *unicode_escape(const unsigned char *p, size_t *len)
{
    if (p[0] == 0xC2 && p[1] == 0x85) {
        *len = 2;
        return "\\N";
    }
    if (p[0] == 0xE2 && p[1] == 0x80 && (p[2] == 0xA8 || p[2] == 0xA9)) {
        *len = 3;
        return p[2] == 0xA8 ? "\\L" : "\\P";
    }
    if (p[0] == 0xEF && p[1] == 0xBB && p[2] == 0xBF) {
        *len = 3;
        return "\\uFEFF";
    }
    return NULL;
}

/* Double-quoted YAML scalar; the escapes are those of JSON plus YAML's own line breaks. */
static void put_quoted(struct buf *b, const char *s)
{
    put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0';) {
        char esc[8];
        size_t len = 1;
        const char *e = ascii_escape(*p, esc, sizeof(esc));

        if (e == NULL) {
            e = unicode_escape(p, &len);
        }
        if (e != NULL) {
            puts_(b, e);
        } else {
            put(b, (const char *)p, 1);
        }
        p += len;
    }
    put(b, "\"", 1);
}

static void put_string(struct buf *b, const char *s)
{
    if (cli_yaml_needs_quotes(s)) {
        put_quoted(b, s);
    } else {
        puts_(b, s);
    }
}

/* The shortest "%.*g" that reads back as the same double, so 0.0225 stays 0.0225. */
static void put_real(struct buf *b, double d)
{
    char tmp[40];

    if (!isfinite(d)) {
        puts_(b, isnan(d) ? ".nan" : (d > 0 ? ".inf" : "-.inf"));
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*g", prec, d);
        if (strtod(tmp, NULL) == d) {
            break;
        }
    }
    puts_(b, tmp);
    if (strpbrk(tmp, ".eE") == NULL) {
        puts_(b, ".0"); /* keep it a float */
    }
}

static void put_scalar(struct buf *b, const json_t *v)
{
    char tmp[32];

    switch (json_typeof(v)) {
    case JSON_STRING:
        put_string(b, json_string_value(v));
        break;
    case JSON_INTEGER:
        snprintf(tmp, sizeof(tmp), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        puts_(b, tmp);
        break;
    case JSON_REAL:
        put_real(b, json_real_value(v));
        break;
    case JSON_TRUE:
        puts_(b, "true");
        break;
    case JSON_FALSE:
        puts_(b, "false");
        break;
    default:
        puts_(b, "null");
        break;
    }
}

static bool is_container(const json_t *v)
{
    return (json_is_object(v) && json_object_size(v) > 0) ||
           (json_is_array(v) && json_array_size(v) > 0);
}

static void put_inline(struct buf *b, const json_t *v)
{
    if (json_is_object(v)) {
        puts_(b, "{}");
    } else if (json_is_array(v)) {
        puts_(b, "[]");
    } else {
        put_scalar(b, v);
    }
}

static void indent(struct buf *b, int n)
{
    for (int i = 0; i < n; i++) {
        put(b, " ", 1);
    }
}

static void emit_seq(struct buf *b, const json_t *arr, int ind, bool inline_first);

/* A mapping at column IND; with INLINE_FIRST the first key continues a "- " line. */
static void emit_map(struct buf *b, const json_t *obj, int ind, bool inline_first)
{
    const char *key;
    const json_t *v;
    bool first = true;

    /* jansson's iteration API is not const-qualified; nothing here modifies OBJ. */
    json_object_foreach((json_t *)(uintptr_t)obj, key, v)
    {
        if (!(first && inline_first)) {
            indent(b, ind);
        }
        first = false;
        put_string(b, key);
        put(b, ":", 1);
        if (json_is_object(v) && is_container(v)) {
            put(b, "\n", 1);
            emit_map(b, v, ind + 2, false);
        } else if (json_is_array(v) && is_container(v)) {
            put(b, "\n", 1);
            emit_seq(b, v, ind, false); /* kubectl: "- " at the key's column */
        } else {
            put(b, " ", 1);
            put_inline(b, v);
            put(b, "\n", 1);
        }
    }
}

static void emit_seq(struct buf *b, const json_t *arr, int ind, bool inline_first)
{
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *v = json_array_get(arr, i);
        if (!(i == 0 && inline_first)) {
            indent(b, ind);
        }
        put(b, "- ", 2);
        if (json_is_object(v) && is_container(v)) {
            emit_map(b, v, ind + 2, true);
        } else if (json_is_array(v) && is_container(v)) {
            emit_seq(b, v, ind + 2, true);
        } else {
            put_inline(b, v);
            put(b, "\n", 1);
        }
    }
}

void cli_yaml_emit(struct buf *out, const json_t *v)
{
    if (json_is_object(v) && is_container(v)) {
        emit_map(out, v, 0, false);
    } else if (json_is_array(v) && is_container(v)) {
        emit_seq(out, v, 0, false);
    } else {
        put_inline(out, v);
        put(out, "\n", 1);
    }
}

void cli_table_init(struct cli_table *t, size_t ncols)
{
    t->ncols = ncols;
    t->nrows = 0;
    t->cells = NULL;
}

void cli_table_add(struct cli_table *t, const char *const *cells)
{
    t->cells = xrealloc(t->cells, (t->nrows + 1) * t->ncols * sizeof(char *));
    for (size_t c = 0; c < t->ncols; c++) {
        t->cells[t->nrows * t->ncols + c] = xstrdup(cells[c] != NULL ? cells[c] : "");
    }
    t->nrows++;
}

/* Display width in characters: UTF-8 continuation bytes do not count. */
static size_t width(const char *s)
{
    size_t n = 0;
    for (; *s != '\0'; s++) {
        n += ((unsigned char)*s & 0xC0) != 0x80;
    }
    return n;
}

void cli_table_render(struct buf *out, const struct cli_table *t)
{
    size_t *w = xcalloc(t->ncols + 1, sizeof(size_t));

    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            size_t cw = width(t->cells[r * t->ncols + c]);
            w[c] = cw > w[c] ? cw : w[c];
        }
    }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *cell = t->cells[r * t->ncols + c];
            puts_(out, cell);
            if (c + 1 < t->ncols) {
                indent(out, (int)(w[c] - width(cell) + 3));
            }
        }
        put(out, "\n", 1);
    }
    free(w);
}

void cli_table_cleanup(struct cli_table *t)
{
    for (size_t i = 0; i < t->nrows * t->ncols; i++) {
        free(t->cells[i]);
    }
    free(t->cells);
    t->cells = NULL;
    t->nrows = 0;
}

/* "<big><unit>" followed by "<small><unit2>" when SMALL is not zero ("3m20s", "2h"). */
static void age2(char out[CLI_AGE_MAX], int64_t big, char unit, int64_t small, char unit2)
{
    if (small == 0) {
        snprintf(out, CLI_AGE_MAX, "%lld%c", (long long)big, unit);
    } else {
        snprintf(out, CLI_AGE_MAX, "%lld%c%lld%c", (long long)big, unit, (long long)small, unit2);
    }
}

void cli_format_age(char out[CLI_AGE_MAX], int64_t ms)
{
    int64_t s = ms / 1000, m = s / 60, h = s / 3600, d = h / 24;

    if (s < -1) {
        snprintf(out, CLI_AGE_MAX, "<invalid>");
    } else if (s < 0) {
        snprintf(out, CLI_AGE_MAX, "0s");
    } else if (s < 60 * 2) {
        age2(out, s, 's', 0, 0);
    } else if (m < 10) {
        age2(out, m, 'm', s % 60, 's');
    } else if (m < 60 * 3) {
        age2(out, m, 'm', 0, 0);
    } else if (h < 8) {
        age2(out, h, 'h', m % 60, 'm');
    } else if (h < 48) {
        age2(out, h, 'h', 0, 0);
    } else if (h < 24 * 8) {
        age2(out, d, 'd', h % 24, 'h');
    } else if (h < 24 * 365 * 2) {
        age2(out, d, 'd', 0, 0);
    } else if (h < 24 * 365 * 8) {
        age2(out, d / 365, 'y', d % 365, 'd');
    } else {
        age2(out, d / 365, 'y', 0, 0);
    }
}
