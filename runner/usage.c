/* SPDX-License-Identifier: Apache-2.0 */
/* Usage lines (untrusted: the agent writes them), their request ids and the offset state
 * that makes every line charged exactly once, also across runner restarts. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/jsonscan.h"
#include "common/money.h"
#include "runner/runner.h"

#define COST_DIGITS_MAX 40 /* significant digits of a costUSD number */
#define COST_EXP_CLAMP 100000L

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Appends digit C to DIG (leading zeros dropped); false when there are too many. */
static bool push_digit(char *dig, size_t *nd, char c)
{
    if (*nd == 0 && c == '0') {
        return true;
    }
    if (*nd >= COST_DIGITS_MAX) {
        return false;
    }
    dig[(*nd)++] = c;
    return true;
}

/* Parses the exponent part at S[*i..len) into *e (clamped); false when malformed. */
static bool parse_exponent(long *e, const char *s, size_t len, size_t *i)
{
    bool neg = false;

    *e = 0;
    if (*i >= len || (s[*i] != 'e' && s[*i] != 'E')) {
        return true;
    }
    (*i)++;
    if (*i < len && (s[*i] == '+' || s[*i] == '-')) {
        neg = s[*i] == '-';
        (*i)++;
    }
    if (*i >= len || !is_digit(s[*i])) {
        return false;
    }
    for (; *i < len && is_digit(s[*i]); (*i)++) {
        if (*e < COST_EXP_CLAMP) {
            *e = *e * 10 + (s[*i] - '0');
        }
    }
    if (neg) {
        *e = -*e;
    }
    return true;
}

/* Appends the digits at S[*i..len) to DIG, counting them in *count; false when too many. */
static bool push_digits(char *dig, size_t *nd, long *count, const char *s, size_t len, size_t *i)
{
    for (; *i < len && is_digit(s[*i]); (*i)++, (*count)++) {
        if (!push_digit(dig, nd, s[*i])) {
            return false;
        }
    }
    return true;
}

/* Parses the integer and fraction parts of S (S[0] is a digit) into the significant
 * digits DIG and the number of fraction digits *frac; *i ends after them. False when
 * malformed or too long. */
static bool parse_mantissa(char *dig, size_t *nd, long *frac, const char *s, size_t len, size_t *i)
{
    long whole = 0;

    if (s[0] == '0') {
        *i = 1;
    } else if (!push_digits(dig, nd, &whole, s, len, i)) {
        return false;
    }
    if (*i < len && s[*i] == '.') {
        (*i)++;
        if (*i >= len || !is_digit(s[*i])) {
            return false;
        }
        if (!push_digits(dig, nd, frac, s, len, i)) {
            return false;
        }
    }
    return true;
}

/* The value of the ND > 0 digits DIG times 10^SCALE micro-dollars (rounded as the meter
 * rounds a JSON number) in *micros_out when it is no larger than RUNNER_COST_MAX_MICROS. */
static int digits_to_micros(int64_t *micros_out, const char *dig, size_t nd, long scale)
{
    int64_t v = 0;

    if (!money_micros_of_digits(&v, dig, nd, scale) || v > RUNNER_COST_MAX_MICROS) {
        return E_INVALID;
    }
    *micros_out = v;
    return E_OK;
}

int runner_cost_parse(int64_t *micros_out, const char *s, size_t len)
{
    char dig[COST_DIGITS_MAX];
    size_t nd = 0, i = 0;
    long frac = 0, e = 0;

    *micros_out = 0;
    if (len == 0 || !is_digit(s[0])) {
        return E_INVALID; /* also refuses a minus sign: amounts are non-negative */
    }
    if (!parse_mantissa(dig, &nd, &frac, s, len, &i)) {
        return E_INVALID;
    }
    if (!parse_exponent(&e, s, len, &i) || i != len) {
        return E_INVALID;
    }
    if (nd == 0) {
        return E_OK;
    }
    return digits_to_micros(micros_out, dig, nd, e - frac + 6);
}

/* Whether the raw string text S[0..len) holds the escape "\u0000". */
static bool has_nul_escape(const char *s, size_t len)
{
    for (size_t i = 0; i + 6 <= len; i++) {
        if (s[i] == '\\' && memcmp(s + i + 1, "u0000", 5) == 0) {
            return true;
        }
        if (s[i] == '\\') {
            i++; /* skip the escaped character ("\\u0000" is a backslash and text) */
        }
    }
    return false;
}

static int parse_model(struct runner_usage *out, const struct jsonscan_value *v, struct err *err)
{
    char *m;
    size_t n;

    if (!v->present || jsonscan_is_null(v)) {
        return E_OK;
    }
    /* "\u0000" would cut the name short after unescaping: refuse it. */
    if (v->len < 2 || v->start[0] != '"' || has_nul_escape(v->start, v->len)) {
        return err_set(err, E_INVALID, "model must be a string");
    }
    m = jsonscan_string(v);
    if (m == NULL) {
        return err_set(err, E_INVALID, "model must be a string");
    }
    n = strlen(m);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)m[i];
        if (c < 0x20 || c == 0x7f) {
            free(m);
            return err_set(err, E_INVALID, "model holds a control character");
        }
    }
    if (n == 0 || n > RUNNER_MODEL_MAX) {
        free(m);
        return err_set(err, E_INVALID, "model must be 1 to %d bytes", RUNNER_MODEL_MAX);
    }
    memcpy(out->model, m, n + 1);
    out->has_model = true;
    free(m);
    return E_OK;
}

static int parse_cost_value(struct runner_usage *out, const struct jsonscan_value *v,
                            struct err *err)
{
    int rc;

    if (!v->present || jsonscan_is_null(v)) {
        return E_OK;
    }
    if (v->len >= 2 && v->start[0] == '"') {
        /* The exact decimal string, as AgentTask objects write money. */
        rc = (v->start[1] == '+' || v->start[1] == '$')
                 ? E_INVALID
                 : money_parse_n(&out->cost_micros, NULL, v->start + 1, v->len - 2, NULL);
        if (rc != E_OK || out->cost_micros > RUNNER_COST_MAX_MICROS) {
            out->cost_micros = 0;
            return err_set(err, E_INVALID, "costUSD must be a non-negative decimal string");
        }
        return E_OK;
    }
    if (v->len == 0 || runner_cost_parse(&out->cost_micros, v->start, v->len) != E_OK) {
        return err_set(err, E_INVALID,
                       "costUSD must be a non-negative number with at most 6 decimals");
    }
    return E_OK;
}

static int parse_tokens(struct runner_usage *out, const struct jsonscan_value *v, struct err *err)
{
    if (!v->present || jsonscan_is_null(v)) {
        return E_OK;
    }
    if (jsonscan_int(&out->tokens, v) != E_OK || out->tokens < 0 ||
        out->tokens > RUNNER_TOKENS_MAX) {
        out->tokens = 0;
        return err_set(err, E_INVALID, "tokensUsed must be a non-negative integer");
    }
    return E_OK;
}

/* Whether LINE[0..len) starts, after blanks, with '{'. */
static bool starts_object(const char *line, size_t len)
{
    size_t i = 0;

    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) {
        i++;
    }
    return i < len && line[i] == '{';
}

int runner_usage_parse(struct runner_usage *out, const char *line, size_t len, struct err *err)
{
    static const struct jsonscan_path paths[] = {{"model"}, {"tokensUsed"}, {"costUSD"}};
    struct jsonscan_value v[3];
    int rc;

    memset(out, 0, sizeof(*out));
    if (len > RUNNER_USAGE_LINE_MAX) {
        return err_set(err, E_INVALID, "usage line longer than %d bytes", RUNNER_USAGE_LINE_MAX);
    }
    if (!starts_object(line, len)) {
        return err_set(err, E_INVALID, "usage line is not a JSON object");
    }
    memset(v, 0, sizeof(v));
    rc = jsonscan_extract(v, line, len, paths, ARRAY_LEN(paths), NULL);
    if (rc != E_OK) {
        return err_set(err, E_INVALID, "usage line is not valid JSON");
    }
    rc = parse_model(out, &v[0], err);
    if (rc == E_OK) {
        rc = parse_tokens(out, &v[1], err);
    }
    if (rc == E_OK) {
        rc = parse_cost_value(out, &v[2], err);
    }
    if (rc != E_OK) {
        memset(out, 0, sizeof(*out));
    }
    return rc;
}

bool runner_usage_next(size_t *line_len_out, size_t *advance_out, const char *buf, size_t len,
                       bool at_eof)
{
    const char *nl = len > 0 ? memchr(buf, '\n', len) : NULL;

    if (nl != NULL) {
        *line_len_out = (size_t)(nl - buf);
        *advance_out = *line_len_out + 1;
        return true;
    }
    if (at_eof && len > 0) {
        *line_len_out = len;
        *advance_out = len;
        return true;
    }
    *line_len_out = 0;
    *advance_out = 0;
    return false;
}

int runner_request_id_usage(char *out, size_t cap, const char *task, uint64_t offset)
{
    int n = snprintf(out, cap, "%s-u%" PRIu64, task, offset);

    return (n < 0 || (size_t)n >= cap || (size_t)n > RUNNER_REQUEST_ID_MAX) ? E_TOOBIG : E_OK;
}

int runner_request_id_heartbeat(char *out, size_t cap, const char *task, long iteration, bool final)
{
    int n = snprintf(out, cap, "%s-i%ld-%s", task, iteration, final ? "f" : "h");

    return (n < 0 || (size_t)n >= cap || (size_t)n > RUNNER_REQUEST_ID_MAX) ? E_TOOBIG : E_OK;
}

size_t runner_state_format(char *out, size_t cap, const struct runner_state *st)
{
    int n = snprintf(out, cap, "%" PRIu64 "\n%s\n", st->offset, st->model);

    return n < 0 ? 0 : ((size_t)n >= cap ? cap - 1 : (size_t)n);
}

int runner_state_parse(struct runner_state *out, const char *text, size_t len)
{
    size_t i = 0, mlen;
    uint64_t v = 0;
    const char *nl;

    memset(out, 0, sizeof(*out));
    if (len == 0 || !is_digit(text[0])) {
        return E_INVALID;
    }
    for (; i < len && is_digit(text[i]); i++) {
        if (v > (UINT64_MAX - 9) / 10 || i >= 19) {
            return E_INVALID;
        }
        v = v * 10 + (uint64_t)(text[i] - '0');
    }
    if (i >= len || text[i] != '\n') {
        return E_INVALID;
    }
    i++;
    nl = memchr(text + i, '\n', len - i);
    mlen = nl != NULL ? (size_t)(nl - (text + i)) : len - i;
    if (mlen > RUNNER_MODEL_MAX || (nl != NULL && (size_t)(nl - text) + 1 != len) ||
        memchr(text + i, '\0', mlen) != NULL) {
        return E_INVALID;
    }
    memcpy(out->model, text + i, mlen);
    out->model[mlen] = '\0';
    out->offset = v;
    return E_OK;
}

int runner_state_load(struct runner_state *out, const char *path, struct err *err)
{
    char text[RUNNER_STATE_MAX];
    ssize_t n;
    int fd;

    memset(out, 0, sizeof(*out));
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) {
            return E_OK;
        }
        return err_set(err, E_FAIL, "cannot open the usage state file: %s", strerror(errno));
    }
    n = read(fd, text, sizeof(text));
    close(fd);
    if (n < 0) {
        return err_set(err, E_FAIL, "cannot read the usage state file: %s", strerror(errno));
    }
    if ((size_t)n >= sizeof(text) || runner_state_parse(out, text, (size_t)n) != E_OK) {
        memset(out, 0, sizeof(*out));
        return err_set(err, E_INVALID, "the usage state file is malformed");
    }
    return E_OK;
}

int runner_state_save(const char *path, const struct runner_state *st, struct err *err)
{
    char text[RUNNER_STATE_MAX + 8];
    size_t len = runner_state_format(text, sizeof(text), st);
    char *tmp = xasprintf("%s.tmp", path);
    int fd, rc = E_OK;

    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        rc = err_set(err, E_FAIL, "cannot write the usage state file: %s", strerror(errno));
        goto out;
    }
    if (write(fd, text, len) != (ssize_t)len || fsync(fd) != 0) {
        rc = err_set(err, E_FAIL, "cannot write the usage state file: %s", strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        rc = err_set(err, E_FAIL, "cannot replace the usage state file: %s", strerror(errno));
        unlink(tmp);
    }
out:
    free(tmp);
    return rc;
}

/* Bytes a state is rewritten in place up to: one sector, written whole or not at all. */
#define RUNNER_STATE_SECTOR 512

void runner_state_file_close(struct runner_state_file *f)
{
    if (f->fd >= 0) {
        close(f->fd);
    }
    f->fd = -1;
    f->len = 0;
}

int runner_state_store(struct runner_state_file *f, const char *path, const struct runner_state *st,
                       struct err *err)
{
    char text[RUNNER_STATE_MAX + 8];
    size_t len = runner_state_format(text, sizeof(text), st);
    int rc;

    if (f->fd >= 0 && len == f->len && len <= RUNNER_STATE_SECTOR &&
        pwrite(f->fd, text, len, 0) == (ssize_t)len && fdatasync(f->fd) == 0) {
        return E_OK;
    }
    /* The first state, another length, or a failed rewrite: a new file, then kept. */
    runner_state_file_close(f);
    rc = runner_state_save(path, st, err);
    if (rc == E_OK) {
        f->fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
        f->len = len;
    }
    return rc;
}
