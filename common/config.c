/* SPDX-License-Identifier: Apache-2.0 */
/* `.diverge/agent.yaml` over common/yamldoc. A table of known keys drives the
 * walk; every value is checked against its declared type, and any problem is reported
 * with the file, the 1-based line and the dotted key, never silently ignored. */
#include "common/config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/money.h"
#include "common/yamldoc.h"

enum field_kind {
    FIELD_VERSION,     /* "1" (quoted or plain) */
    FIELD_SECTION,     /* a nested mapping, described by children */
    FIELD_STRING,      /* a non-empty string */
    FIELD_STRING_LIST, /* a sequence of non-empty strings */
    FIELD_MONEY,       /* decimal USD, quoted or plain, via money_parse_n */
    FIELD_COUNT,       /* non-negative integer up to INT64_MAX */
    FIELD_SMALL_COUNT, /* non-negative integer up to INT32_MAX */
    FIELD_NETWORK,     /* "none" or "proxy" */
};

#define NO_MEMBER ((size_t)-1)

struct field {
    const char *key;              /* YAML key */
    enum field_kind kind;         /* what the value must be */
    size_t off;                   /* offset of the value member in struct config_agent */
    size_t off_n;                 /* FIELD_STRING_LIST: offset of the count member */
    size_t off_has;               /* offset of the bool has_* member, or NO_MEMBER */
    const struct field *children; /* FIELD_SECTION: its keys */
    size_t n_children;            /* entries in children */
};

#define MEMBER(m_) offsetof(struct config_agent, m_)

static const struct field agent_fields[] = {
    {"capabilities", FIELD_STRING_LIST, MEMBER(capabilities), MEMBER(n_capabilities),
     MEMBER(has_capabilities), NULL, 0},
    {"allowedTools", FIELD_STRING_LIST, MEMBER(allowed_tools), MEMBER(n_allowed_tools),
     MEMBER(has_allowed_tools), NULL, 0},
    {"budgetUSD", FIELD_MONEY, MEMBER(budget_usd_micros), NO_MEMBER, MEMBER(has_budget_usd), NULL,
     0},
    {"budgetTokens", FIELD_COUNT, MEMBER(budget_tokens), NO_MEMBER, MEMBER(has_budget_tokens), NULL,
     0},
    {"maxIterations", FIELD_SMALL_COUNT, MEMBER(max_iterations), NO_MEMBER,
     MEMBER(has_max_iterations), NULL, 0},
    {"baseBranch", FIELD_STRING, MEMBER(base_branch), NO_MEMBER, NO_MEMBER, NULL, 0},
    {"command", FIELD_STRING, MEMBER(command), NO_MEMBER, NO_MEMBER, NULL, 0},
    {"verifyCommand", FIELD_STRING, MEMBER(verify_command), NO_MEMBER, NO_MEMBER, NULL, 0},
};

static const struct field sandbox_fields[] = {
    {"provider", FIELD_STRING, MEMBER(sandbox_provider), NO_MEMBER, NO_MEMBER, NULL, 0},
    {"timeoutSeconds", FIELD_SMALL_COUNT, MEMBER(sandbox_timeout_s), NO_MEMBER,
     MEMBER(has_sandbox_timeout), NULL, 0},
    {"network", FIELD_NETWORK, MEMBER(sandbox_network), NO_MEMBER, NO_MEMBER, NULL, 0},
    {"allowedHosts", FIELD_STRING_LIST, MEMBER(allowed_hosts), MEMBER(n_allowed_hosts),
     MEMBER(has_allowed_hosts), NULL, 0},
};

static const struct field top_fields[] = {
    {"version", FIELD_VERSION, NO_MEMBER, NO_MEMBER, NO_MEMBER, NULL, 0},
    {"agent", FIELD_SECTION, NO_MEMBER, NO_MEMBER, NO_MEMBER, agent_fields,
     ARRAY_LEN(agent_fields)},
    {"sandbox", FIELD_SECTION, NO_MEMBER, NO_MEMBER, NO_MEMBER, sandbox_fields,
     ARRAY_LEN(sandbox_fields)},
};

/* How a plain (unquoted) scalar resolves; quoted scalars are always strings. */
enum scalar_kind {
    SCALAR_NULL,
    SCALAR_BOOL,
    SCALAR_INT,
    SCALAR_FLOAT,
    SCALAR_STR,
};

struct loader {
    const struct yamldoc *doc; /* borrowed */
    const char *name;          /* file name for messages; borrowed */
    struct config_agent *cfg;  /* being filled; borrowed */
    bool seen_version;         /* the top-level version key was present */
    struct err *err;           /* caller's; may be NULL */
};

#define PATH_MAX_LEN 96

/* Records "NAME:LINE: KEY: problem" with KEY as the field; returns E_INVALID. */
static int fail_at(struct loader *l, const struct yamldoc_node *node, const char *key,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int fail_at(struct loader *l, const struct yamldoc_node *node, const char *key,
                   const char *fmt, ...)
{
    char problem[256];
    size_t line = node != NULL ? yamldoc_line(node) : 1;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(problem, sizeof(problem), fmt, ap);
    va_end(ap);
    return err_set_field(l->err, E_INVALID, key, "%s:%zu: %s: %s", l->name, line, key, problem);
}

static const char *scalar_text(const struct yamldoc_node *n)
{
    return yamldoc_scalar(n);
}

static bool text_in(const char *s, const char *const *words, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(s, words[i]) == 0) {
            return true;
        }
    }
    return false;
}

static bool all_digits(const char *s, const char *end)
{
    if (s == end) {
        return false;
    }
    for (; s < end; s++) {
        if (*s < '0' || *s > '9') {
            return false;
        }
    }
    return true;
}

static const char *skip_digits(const char *p)
{
    while (*p >= '0' && *p <= '9') {
        p++;
    }
    return p;
}

/* [-+]? ( digits ( "." digits? )? | "." digits ) ( [eE] [-+]? digits )? */
static bool looks_float(const char *s)
{
    const char *p = s + ((*s == '-' || *s == '+') ? 1 : 0), *q = skip_digits(p), *e;
    bool digits = q != p;

    if (*q == '.') {
        const char *frac = q + 1;
        q = skip_digits(frac);
        digits = digits || q != frac;
    }
    if (!digits) {
        return false; /* "", "-", "." */
    }
    if (*q == 'e' || *q == 'E') {
        q++;
        e = q + ((*q == '-' || *q == '+') ? 1 : 0);
        q = skip_digits(e);
        if (q == e) {
            return false;
        }
    }
    return *q == '\0';
}

/* Resolution of plain scalars after YAML 1.1 (libyaml's version) so that `on`, `yes`
 * or `~` never pass for strings by accident. */
static enum scalar_kind resolve(const struct yamldoc_node *n)
{
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL"};
    static const char *const bools[] = {"true", "True", "TRUE", "false", "False", "FALSE",
                                        "yes",  "Yes",  "YES",  "no",    "No",    "NO",
                                        "on",   "On",   "ON",   "off",   "Off",   "OFF"};
    static const char *const floats[] = {".inf",  ".Inf",  ".INF", "-.inf", "-.Inf",
                                         "-.INF", "+.inf", ".nan", ".NaN",  ".NAN"};
    const char *s = scalar_text(n), *digits;

    if (!yamldoc_plain(n)) {
        return SCALAR_STR;
    }
    if (text_in(s, nulls, ARRAY_LEN(nulls))) {
        return SCALAR_NULL;
    }
    if (text_in(s, bools, ARRAY_LEN(bools))) {
        return SCALAR_BOOL;
    }
    digits = s + ((*s == '-' || *s == '+') ? 1 : 0);
    if (all_digits(digits, digits + strlen(digits)) ||
        (strncmp(s, "0x", 2) == 0 && s[2] != '\0' &&
         strspn(s + 2, "0123456789abcdefABCDEF") == strlen(s + 2))) {
        return SCALAR_INT;
    }
    if (looks_float(s) || text_in(s, floats, ARRAY_LEN(floats))) {
        return SCALAR_FLOAT;
    }
    return SCALAR_STR;
}

/* A non-empty string without NUL bytes; *out is a new copy. */
static int take_string(char **out, struct loader *l, const struct yamldoc_node *n, const char *key)
{
    *out = NULL;
    if (yamldoc_kind(n) != YAMLDOC_SCALAR || resolve(n) != SCALAR_STR) {
        return fail_at(l, n, key, "expected a string");
    }
    if (yamldoc_scalar_len(n) == 0) {
        return fail_at(l, n, key, "expected a non-empty string");
    }
    if (strlen(scalar_text(n)) != yamldoc_scalar_len(n)) {
        return fail_at(l, n, key, "string contains a NUL byte");
    }
    *out = xstrdup(scalar_text(n));
    return E_OK;
}

static int load_string_list(struct loader *l, const struct yamldoc_node *n, const struct field *f,
                            const char *key)
{
    char ***items = (char ***)(void *)((char *)l->cfg + f->off);
    size_t *count = (size_t *)(void *)((char *)l->cfg + f->off_n);
    size_t cap;
    int rc;

    if (yamldoc_kind(n) != YAMLDOC_SEQUENCE) {
        return fail_at(l, n, key, "expected a list of strings");
    }
    cap = yamldoc_count(n);
    *items = xcalloc(cap + 1, sizeof(char *));
    for (size_t it = 0; it < cap; it++) {
        const struct yamldoc_node *item = yamldoc_item(l->doc, n, it);
        char item_key[PATH_MAX_LEN + 24];

        snprintf(item_key, sizeof(item_key), "%s[%zu]", key, *count);
        rc = take_string(&(*items)[*count], l, item, item_key);
        if (rc != E_OK) {
            return rc;
        }
        (*count)++;
    }
    return E_OK;
}

/* A plain, non-negative decimal integer without sign or leading zeros, up to MAX. */
static int load_count(struct loader *l, const struct yamldoc_node *n, const struct field *f,
                      const char *key, int64_t max)
{
    int64_t *dst = (int64_t *)(void *)((char *)l->cfg + f->off), v = 0;
    const char *s;

    if (yamldoc_kind(n) != YAMLDOC_SCALAR || resolve(n) != SCALAR_INT) {
        return fail_at(l, n, key, "expected a non-negative integer");
    }
    s = scalar_text(n);
    if (!all_digits(s, s + strlen(s))) {
        return fail_at(l, n, key, "expected a non-negative integer");
    }
    if (s[0] == '0' && s[1] != '\0') {
        /* YAML 1.1 reads 010 as octal 8; refuse rather than guess. */
        return fail_at(l, n, key, "expected a non-negative integer without leading zeros");
    }
    for (; *s != '\0'; s++) {
        if (v > (max - (*s - '0')) / 10) {
            return fail_at(l, n, key, "integer out of range (at most %lld)", (long long)max);
        }
        v = v * 10 + (*s - '0');
    }
    *dst = v;
    return E_OK;
}

static int load_money(struct loader *l, const struct yamldoc_node *n, const struct field *f,
                      const char *key)
{
    int64_t *dst = (int64_t *)(void *)((char *)l->cfg + f->off);
    enum scalar_kind kind;
    struct err perr = {0};
    bool plus = false;

    if (yamldoc_kind(n) != YAMLDOC_SCALAR) {
        return fail_at(l, n, key, "expected a decimal amount such as \"5.00\"");
    }
    kind = resolve(n);
    if (kind == SCALAR_NULL || kind == SCALAR_BOOL ||
        money_parse_n(dst, &plus, scalar_text(n), yamldoc_scalar_len(n), &perr) != E_OK) {
        return fail_at(l, n, key, "expected a decimal amount such as \"5.00\"%s%s",
                       perr.msg[0] != '\0' ? ": " : "", perr.msg);
    }
    if (plus) {
        return fail_at(l, n, key, "expected an amount, not a '+' increment");
    }
    return E_OK;
}

/* sandbox.network: the word none or proxy. */
static int load_network(struct loader *l, const struct yamldoc_node *n, const struct field *f,
                        const char *key)
{
    char **dst = (char **)(void *)((char *)l->cfg + f->off);
    int rc = take_string(dst, l, n, key);

    if (rc == E_OK && strcmp(*dst, "none") != 0 && strcmp(*dst, "proxy") != 0) {
        free(*dst);
        *dst = NULL;
        return fail_at(l, n, key, "expected none or proxy");
    }
    return rc;
}

static int load_mapping(struct loader *l, const struct yamldoc_node *map, const char *prefix,
                        const struct field *fields, size_t n_fields);

static int load_value(struct loader *l, const struct yamldoc_node *v, const struct field *f,
                      const char *key)
{
    switch (f->kind) {
    case FIELD_VERSION:
        if (yamldoc_kind(v) != YAMLDOC_SCALAR || strcmp(scalar_text(v), "1") != 0 ||
            (resolve(v) != SCALAR_STR && resolve(v) != SCALAR_INT)) {
            return fail_at(l, v, key, "unsupported version (want \"1\")");
        }
        l->seen_version = true;
        return E_OK;
    case FIELD_SECTION:
        if (yamldoc_kind(v) == YAMLDOC_SCALAR && resolve(v) == SCALAR_NULL) {
            return E_OK; /* "agent:" with every entry commented out */
        }
        if (yamldoc_kind(v) != YAMLDOC_MAPPING) {
            return fail_at(l, v, key, "expected a mapping");
        }
        return load_mapping(l, v, key, f->children, f->n_children);
    case FIELD_STRING:
        return take_string((char **)(void *)((char *)l->cfg + f->off), l, v, key);
    case FIELD_STRING_LIST:
        return load_string_list(l, v, f, key);
    case FIELD_MONEY:
        return load_money(l, v, f, key);
    case FIELD_COUNT:
        return load_count(l, v, f, key, INT64_MAX);
    case FIELD_SMALL_COUNT:
        return load_count(l, v, f, key, INT32_MAX);
    case FIELD_NETWORK:
        return load_network(l, v, f, key);
    }
    ASSERT(0);
    return E_FAIL;
}

/* "PREFIX.NAME" for messages: NAME cut at 40 bytes, control characters (a folded
 * multi-line key) shown as '?', so an error stays one line. */
static void key_path(char out[PATH_MAX_LEN], const char *prefix, const char *name)
{
    size_t n = (size_t)snprintf(out, PATH_MAX_LEN, "%s%s%.40s", prefix,
                                prefix[0] != '\0' ? "." : "", name);

    for (size_t i = 0; i < n && i < PATH_MAX_LEN; i++) {
        if ((unsigned char)out[i] < 0x20 || out[i] == 0x7f) {
            out[i] = '?';
        }
    }
}

static int load_mapping(struct loader *l, const struct yamldoc_node *map, const char *prefix,
                        const struct field *fields, size_t n_fields)
{
    unsigned seen = 0; /* bit i: fields[i] was given */

    ASSERT(n_fields <= sizeof(seen) * 8);
    for (size_t pair = 0; pair < yamldoc_count(map); pair++) {
        const struct yamldoc_node *k, *v;
        char key[PATH_MAX_LEN];
        size_t i;
        int rc;

        yamldoc_pair(&k, &v, l->doc, map, pair);
        if (yamldoc_kind(k) != YAMLDOC_SCALAR) {
            if (prefix[0] == '\0') {
                return err_set(l->err, E_INVALID, "%s:%zu: mapping keys must be plain strings",
                               l->name, yamldoc_line(k));
            }
            return fail_at(l, k, prefix, "mapping keys must be plain strings");
        }
        key_path(key, prefix, scalar_text(k));
        for (i = 0; i < n_fields && strcmp(fields[i].key, scalar_text(k)) != 0; i++) {
        }
        if (i == n_fields) {
            return fail_at(l, k, key, "unknown key");
        }
        if (seen & (1u << i)) {
            return fail_at(l, k, key, "duplicate key");
        }
        seen |= 1u << i;
        rc = load_value(l, v, &fields[i], key);
        if (rc != E_OK) {
            return rc;
        }
        if (fields[i].off_has != NO_MEMBER) {
            *(bool *)(void *)((char *)l->cfg + fields[i].off_has) = true;
        }
    }
    return E_OK;
}

static int syntax_error(const struct yamldoc_syntax *p, const char *name, struct err *err)
{
    if (p->out_of_memory) {
        return err_set(err, E_FAIL, "%s: out of memory while parsing", name);
    }
    return err_set(err, E_INVALID, "%s:%zu: %s%s%s", name, p->line,
                   p->problem != NULL ? p->problem : "malformed YAML",
                   p->context != NULL ? " " : "", p->context != NULL ? p->context : "");
}

static int load_document(struct config_agent *cfg, struct yamldoc_reader *reader, const char *name,
                         struct err *err)
{
    struct yamldoc *doc = NULL, *extra = NULL;
    struct yamldoc_syntax syn = {0};
    struct loader l = {.doc = NULL, .name = name, .cfg = cfg, .err = err};
    const struct yamldoc_node *root;
    int rc;

    if (yamldoc_next(&doc, reader, &syn) != E_OK) {
        return syntax_error(&syn, name, err);
    }
    l.doc = doc;
    root = yamldoc_root(doc);
    if (root == NULL) {
        rc = fail_at(&l, NULL, "version", "required (write version: \"1\")");
        goto out;
    }
    if (yamldoc_kind(root) != YAMLDOC_MAPPING) {
        rc = err_set(err, E_INVALID, "%s:%zu: expected a mapping at the top level", name,
                     yamldoc_line(root));
        goto out;
    }
    rc = load_mapping(&l, root, "", top_fields, ARRAY_LEN(top_fields));
    if (rc == E_OK && !l.seen_version) {
        rc = fail_at(&l, root, "version", "required (write version: \"1\")");
    }
    if (rc != E_OK) {
        goto out;
    }
    /* A second document would be silently ignored otherwise. */
    if (yamldoc_next(&extra, reader, &syn) != E_OK) {
        rc = syntax_error(&syn, name, err);
        goto out;
    }
    if (yamldoc_root(extra) != NULL) {
        rc = err_set(err, E_INVALID, "%s:%zu: expected a single YAML document", name,
                     yamldoc_line_of_doc(extra));
    }
    yamldoc_free(extra);
out:
    yamldoc_free(doc);
    return rc;
}

int config_agent_load_mem(struct config_agent **out, const char *name, const char *data, size_t len,
                          struct err *err)
{
    struct config_agent *cfg = NULL;
    struct yamldoc_reader *reader = NULL;
    int rc;

    *out = NULL;
    if (len > CONFIG_AGENT_MAX_BYTES) {
        return err_set(err, E_TOOBIG, "%s: larger than %u bytes", name, CONFIG_AGENT_MAX_BYTES);
    }
    if (yamldoc_reader_new(&reader, data, len) != E_OK) {
        return err_set(err, E_FAIL, "%s: cannot initialise the YAML parser", name);
    }
    cfg = xcalloc(1, sizeof(*cfg));
    rc = load_document(cfg, reader, name, err);
    yamldoc_reader_free(reader);
    if (rc != E_OK) {
        config_agent_free(cfg);
        return rc;
    }
    *out = cfg;
    return E_OK;
}

int config_agent_load_file(struct config_agent **out, const char *path, struct err *err)
{
    char *data = xmalloc(CONFIG_AGENT_MAX_BYTES + 1);
    size_t len = 0, n;
    FILE *f;
    int rc;

    *out = NULL;
    f = fopen(path, "rb");
    if (f == NULL) {
        rc = errno == ENOENT ? err_set(err, E_NOTFOUND, "%s: no such file", path)
                             : err_set(err, E_FAIL, "%s: %s", path, strerror(errno));
        goto out;
    }
    /* Read one byte past the cap so an oversized file is told apart from a full one. */
    while ((n = fread(data + len, 1, CONFIG_AGENT_MAX_BYTES + 1 - len, f)) > 0) {
        len += n;
        if (len > CONFIG_AGENT_MAX_BYTES) {
            break;
        }
    }
    if (ferror(f)) {
        rc = err_set(err, E_FAIL, "%s: read failed", path);
        goto out;
    }
    rc = config_agent_load_mem(out, path, data, len, err);
out:
    if (f != NULL) {
        fclose(f);
    }
    free(data);
    return rc;
}

static void free_list(char **items, size_t n)
{
    for (size_t i = 0; items != NULL && i < n; i++) {
        free(items[i]);
    }
    free(items);
}

void config_agent_free(struct config_agent *cfg)
{
    if (cfg == NULL) {
        return;
    }
    free_list(cfg->capabilities, cfg->n_capabilities);
    free_list(cfg->allowed_tools, cfg->n_allowed_tools);
    free(cfg->base_branch);
    free(cfg->command);
    free(cfg->verify_command);
    free(cfg->sandbox_provider);
    free(cfg->sandbox_network);
    free_list(cfg->allowed_hosts, cfg->n_allowed_hosts);
    free(cfg);
}
