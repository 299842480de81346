/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of common/: money parsing and formatting, buf caps, RFC 3339, JSON scanning,
 * error messages as valid UTF-8, log line escaping, secret file checks. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/jsonscan.h"
#include "common/jsonw.h"
#include "common/log.h"
#include "common/money.h"
#include "common/secret.h"
#include "tests/t_check.h"

static int64_t parse(const char *s, int *rc_out)
{
    int64_t v = -1;
    *rc_out = money_parse(&v, NULL, s, NULL);
    return v;
}

TEST(money_parse_forms)
{
    static const struct {
        const char *in;
        int64_t want;
    } ok[] = {
        {"5.00", 5000000},
        {"0.0225", 22500},
        {"+15.00", 15000000},
        {"$5", 5000000},
        {"+$15", 15000000},
        {"$15.00", 15000000},
        {"0", 0},
        {"0.000001", 1},
        {"12.345678", 12345678},
        {"9223372036854.775807", INT64_MAX},
    };
    for (size_t i = 0; i < ARRAY_LEN(ok); i++) {
        int rc;
        int64_t v = parse(ok[i].in, &rc);
        CHECK_OK(rc);
        CHECK_EQ_INT(v, ok[i].want);
    }
}

TEST(money_parse_errors)
{
    static const struct {
        const char *in;
        int want;
    } bad[] = {
        {"", E_INVALID},
        {"$", E_INVALID},
        {"1.0000001", E_INVALID},
        {"-1", E_INVALID},
        {"1e3", E_INVALID},
        {"1.", E_INVALID},
        {".5", E_INVALID},
        {" 1", E_INVALID},
        {"1 ", E_INVALID},
        {"abc", E_INVALID},
        {"1.2.3", E_INVALID},
        {"++1", E_INVALID},
        {"9223372036854.775808", E_TOOBIG},
        {"99999999999999999999", E_TOOBIG},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        int rc;
        (void)parse(bad[i].in, &rc);
        if (rc != bad[i].want) {
            t_fail(__FILE__, __LINE__, "money_parse(\"%s\") = %d, want %d", bad[i].in, rc,
                   bad[i].want);
        }
    }
}

TEST(money_plus_flag)
{
    int64_t v;
    bool plus = false;
    CHECK_OK(money_parse(&v, &plus, "+$1.5", NULL));
    CHECK(plus);
    CHECK_EQ_INT(v, 1500000);
    CHECK_OK(money_parse(&v, &plus, "1.5", NULL));
    CHECK(!plus);
}

TEST(money_format_roundtrip)
{
    char out[MONEY_STR_MAX];
    static const char *const strs[] = {
        "5.00", "0.0675", "0.0225", "12.345678", "0.00", "1000000.10", "9223372036854.775807"};
    for (size_t i = 0; i < ARRAY_LEN(strs); i++) {
        int64_t v;
        CHECK_OK(money_parse(&v, NULL, strs[i], NULL));
        money_format(out, v);
        CHECK_EQ_STR(out, strs[i]);
    }
    money_format(out, -22500);
    CHECK_EQ_STR(out, "-0.0225");
    money_format(out, INT64_MIN);
    CHECK_EQ_STR(out, "-9223372036854.775808");
    money_format(out, -1);
    CHECK_EQ_STR(out, "-0.000001");
    money_format(out, 10);
    CHECK_EQ_STR(out, "0.00001");
    money_format(out, 1200000);
    CHECK_EQ_STR(out, "1.20");
}

TEST(money_add_overflow)
{
    int64_t s;
    CHECK_EQ_INT(money_add(&s, INT64_MAX, 1, NULL), E_TOOBIG);
    CHECK_OK(money_add(&s, 1, 2, NULL));
    CHECK_EQ_INT(s, 3);
}

TEST(buf_cap)
{
    struct buf b;
    buf_init(&b, 8);
    CHECK_OK(buf_puts(&b, "12345678"));
    CHECK_EQ_INT(buf_puts(&b, "9"), E_TOOBIG);
    CHECK_EQ_STR(b.data, "12345678");
    buf_cleanup(&b);
}

TEST(rfc3339)
{
    char out[CLOCK_RFC3339_MAX];
    int64_t ms;
    CHECK_OK(clock_parse_rfc3339(&ms, "2026-11-29T10:00:00Z"));
    clock_rfc3339(out, ms);
    CHECK_EQ_STR(out, "2026-11-29T10:00:00Z");
    CHECK_OK(clock_parse_rfc3339(&ms, "2026-11-29T12:00:00+02:00"));
    clock_rfc3339(out, ms);
    CHECK_EQ_STR(out, "2026-11-29T10:00:00Z");
    CHECK_EQ_INT(clock_parse_rfc3339(&ms, "2026-11-29 10:00:00Z"), E_INVALID);
}

TEST(utc_seconds_agree_with_gmtime)
{
    /* From 1600 to 2400 in steps just under 13 days, so the time of day moves too:
     * leap days, century years and seconds before the epoch. */
    for (int64_t t = INT64_C(-11676096000); t < INT64_C(13569465600); t += 86399 * 13) {
        char ours[CLOCK_RFC3339_MAX], want[CLOCK_RFC3339_MAX];
        time_t secs = (time_t)t;
        struct tm tm;

        gmtime_r(&secs, &tm);
        snprintf(want, sizeof(want), "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        CHECK_EQ_INT((long long)clock_utc_seconds(ours, t), (long long)strlen(want));
        if (strcmp(ours, want) != 0) {
            t_fail(__FILE__, __LINE__, "%lld: %s, gmtime says %s", (long long)t, ours, want);
            return;
        }
    }
}

TEST(jsonscan_accepts_and_refuses)
{
    static const char *const good[] = {
        "{}",
        "[]",
        " {\"a\" : [1, -2.5e+3, true, false, null, \"x\\u00e9\\n\"]} ",
        "0",
        "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"",
        "[[[]]]",
        "{\"a\":{\"b\":{}}}",
    };
    static const char *const bad[] = {
        "",
        " ",
        "{",
        "}",
        "[1,]",
        "{\"a\":}",
        "{\"a\" 1}",
        "{a:1}",
        "01",
        "1.",
        "-",
        "1e",
        "tru",
        "nul",
        "\"abc",
        "\"\\x\"",
        "\"\\u12g4\"",
        "\"\x01\"",
        "{} {}",
        "\"\xff\"",
        "\"\xc3\"",
        "\"\xed\xa0\x80\"",
        "[1 2]",
        "{\"a\":1,}",
    };
    for (size_t i = 0; i < ARRAY_LEN(good); i++) {
        if (jsonscan_check(good[i], strlen(good[i]), NULL) != E_OK) {
            t_fail(__FILE__, __LINE__, "refused good %zu: %s", i, good[i]);
        }
    }
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        if (jsonscan_check(bad[i], strlen(bad[i]), NULL) != E_INVALID) {
            t_fail(__FILE__, __LINE__, "accepted bad %zu: %s", i, bad[i]);
        }
    }
    /* Depth limit: 600 nested arrays. */
    char deep[1300];
    memset(deep, '[', 600);
    memset(deep + 600, ']', 600);
    CHECK_EQ_INT(jsonscan_check(deep, 1200, NULL), E_INVALID);
    CHECK_OK(jsonscan_check(deep + 100, 1000, NULL));
}

/* The word-at-a-time string scan: one byte that needs a look (control, quote, backslash,
 * UTF-8) at every position of a long string, across the 8-byte steps. */
TEST(jsonscan_string_special_byte_at_every_offset)
{
    static const struct {
        const char *ins; /* put at offset k of the string's text */
        int want;
    } cases[] = {
        {"\x01", E_INVALID}, {"\x1f", E_INVALID}, {"\"", E_INVALID},      {"\\", E_INVALID},
        {"\\n", E_OK},       {"\\u00e9", E_OK},   {"\xc3\xa9", E_OK},     {"\xc3", E_INVALID},
        {"\xff", E_INVALID}, {"\x7f", E_OK},      {"\xe2\x80\xa8", E_OK}, {" ", E_OK},
    };
    char buf[64];

    for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
        for (size_t k = 0; k <= 24; k++) {
            size_t n = 0;
            buf[n++] = '"';
            memset(buf + n, 'a', k);
            n += k;
            memcpy(buf + n, cases[c].ins, strlen(cases[c].ins));
            n += strlen(cases[c].ins);
            memset(buf + n, 'x', 17); /* "\\x" is no escape */
            n += 17;
            buf[n++] = '"';
            if (jsonscan_check(buf, n, NULL) != cases[c].want) {
                t_fail(__FILE__, __LINE__, "case %zu at offset %zu: want %d", c, k, cases[c].want);
            }
        }
    }
    /* A string cut short inside an 8-byte step is refused. */
    CHECK_EQ_INT(jsonscan_check("\"abcdefghijklmnop", 17, NULL), E_INVALID);
    CHECK_EQ_INT(jsonscan_check("\"abcdefghijklmno\"", 17, NULL), E_OK);
}

TEST(jsonw_matches_jansson_compact)
{
    static const char *const docs[] = {
        "{}",
        "[]",
        "{\"a\":1,\"b\":[true,false,null,-7],\"c\":{\"d\":\"x\\ny\\t\\\"q\\\\\"}}",
        "{\"u\":\"\\u0001\\u001f caf\\u00e9 \\u20ac /\",\"big\":9223372036854775807}",
        "[{\"k\":[]},{\"k\":{}},\"\"]",
        "[0,-1,10,-9223372036854775808,1000000,\"0123456789abcdef\\u007f\\u0080x\"]",
    };
    for (size_t i = 0; i < ARRAY_LEN(docs); i++) {
        json_t *j = json_loads(docs[i], 0, NULL);
        char *a = json_dumps(j, JSON_COMPACT), *b = jsonw_dumps(j);
        CHECK_EQ_STR(b, a);
        free(a);
        free(b);
        json_decref(j);
    }
}

/* Two bytes to escape at every pair of offsets (the short strings' one-word check and the
 * tail check run again after each escape), in a value and in an object key. */
TEST(jsonw_two_escapes_in_values_and_keys)
{
    char s[20];

    for (size_t len = 2; len < sizeof(s); len++) {
        for (size_t a = 0; a < len; a++) {
            for (size_t b = a + 1; b < len; b++) {
                json_t *j = json_object();
                char *x, *y;
                memset(s, 'k', len);
                s[len] = '\0';
                s[a] = '"';
                s[b] = '\n';
                json_object_set_new(j, s, json_string(s));
                x = json_dumps(j, JSON_COMPACT);
                y = jsonw_dumps(j);
                CHECK_EQ_STR(y, x);
                free(x);
                free(y);
                json_decref(j);
            }
        }
    }
}

/* Every byte that must be escaped, at every offset of a string around the writer's 8-byte
 * steps, and a string longer than the writer's first buffer. */
TEST(jsonw_escapes_at_every_offset)
{
    static const char specials[] = {'"', '\\', '\n', '\x01', '\x1f', (char)0xc3};
    char s[40], *big = xmalloc(5001);

    for (size_t k = 0; k < sizeof(specials); k++) {
        for (size_t len = 1; len < sizeof(s); len++) {
            for (size_t at = 0; at < len; at++) {
                json_t *j;
                char *a, *b;
                memset(s, 'a', len);
                s[len] = '\0';
                s[at] = specials[k];
                if (specials[k] == (char)0xc3) {
                    s[at] = at + 1 < len ? (char)0xc3 : 'z'; /* a whole UTF-8 é */
                    if (at + 1 < len) {
                        s[at + 1] = (char)0xa9;
                    }
                }
                j = json_string(s);
                a = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
                b = jsonw_dumps(j);
                CHECK_EQ_STR(b, a);
                free(a);
                free(b);
                json_decref(j);
            }
        }
    }
    memset(big, 'q', 5000);
    big[5000] = '\0';
    big[4999] = '"';
    {
        json_t *j = json_pack("{s:s,s:I}", "big", big, "n", (json_int_t)-42);
        char *a = json_dumps(j, JSON_COMPACT), *b = jsonw_dumps(j);
        struct buf w;
        CHECK_EQ_STR(b, a);
        buf_init(&w, 0);
        jsonw_string(&w, big);
        CHECK_EQ_INT((long long)w.len, 5002 + 1);
        buf_cleanup(&w);
        free(a);
        free(b);
        json_decref(j);
    }
    free(big);
}

TEST(jsonscan_extracts_paths)
{
    static const struct jsonscan_path paths[] = {{"a.b"}, {"a.n"}, {"x"}, {"arr"}, {"k"}, {"gone"}};
    const char *doc = "{\"a\":{\"b\":\"h\\u00e9\\ud83d\\ude00\\n\\\"q\\\"\",\"n\":-42},"
                      "\"arr\":[{\"x\":1}],\"x\":null,\"k\":1,\"k\":2}";
    struct jsonscan_value v[ARRAY_LEN(paths)];
    int64_t n = 0;
    char *str;

    CHECK_OK(jsonscan_extract(v, doc, strlen(doc), paths, ARRAY_LEN(paths), NULL));
    str = jsonscan_string(&v[0]);
    CHECK_EQ_STR(str, "h\xc3\xa9\xf0\x9f\x98\x80\n\"q\"");
    free(str);
    CHECK_OK(jsonscan_int(&n, &v[1]));
    CHECK_EQ_INT(n, -42);
    CHECK(jsonscan_is_null(&v[2])); /* the top-level x, not the one inside the array */
    CHECK(v[3].present && v[3].len == 0 && v[3].start[0] == '[');
    CHECK_OK(jsonscan_int(&n, &v[4]));
    CHECK_EQ_INT(n, 2); /* the last duplicate wins, as in jansson */
    CHECK(!v[5].present);
    CHECK_EQ_INT(jsonscan_int(&n, &v[0]), E_INVALID);
    CHECK_EQ_INT(jsonscan_extract(v, "{\"a\":", 5, paths, ARRAY_LEN(paths), NULL), E_INVALID);
}

/* jansson refuses strings that are not valid UTF-8: the property the HTTP layer needs. */
static bool utf8_valid(const char *s)
{
    json_t *j = json_string(s);
    bool ok = j != NULL;

    json_decref(j);
    return ok;
}

TEST(err_utf8_char_len_refuses_malformed)
{
    static const struct {
        const char *s;
        size_t n, want;
    } cases[] = {
        {"a", 1, 1},
        {"\xc3\xa9", 2, 2},
        {"\xe2\x82\xac", 3, 3},
        {"\xf0\x9f\x98\x80", 4, 4},
        {"\xc3", 1, 0},             /* cut short */
        {"\xf0\x9f\x98", 3, 0},     /* cut short */
        {"\x80", 1, 0},             /* stray continuation byte */
        {"\xc0\xaf", 2, 0},         /* overlong '/' */
        {"\xe0\x80\xaf", 3, 0},     /* overlong '/' */
        {"\xed\xa0\x80", 3, 0},     /* surrogate */
        {"\xf4\x90\x80\x80", 4, 0}, /* past U+10FFFF */
        {"\xff", 1, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        CHECK_EQ_INT(err_utf8_char_len(cases[i].s, cases[i].n), cases[i].want);
    }
}

TEST(err_set_replaces_invalid_bytes)
{
    struct err err = {0};

    CHECK_EQ_INT(err_set(&err, E_NOTFOUND, "no such path: %s", "/\xff\xc3x"), E_NOTFOUND);
    CHECK_EQ_STR(err.msg, "no such path: /\xef\xbf\xbd\xef\xbf\xbdx");
    CHECK(utf8_valid(err.msg));
    err_set_field(&err, E_INVALID, "spec.\xe9", "bad %s", "\xed\xa0\x80");
    CHECK(utf8_valid(err.msg));
    CHECK(utf8_valid(err.field));
}

TEST(err_set_cuts_long_messages_on_a_character_boundary)
{
    char path[2 + 2 * 300 + 1] = "/a";
    char four[1 + 4 * 200 + 1] = "x";
    struct err err = {0};

    for (int i = 0; i < 300; i++) {
        memcpy(path + 2 + 2 * i, "\xc3\xa9", 2);
    }
    path[sizeof(path) - 1] = '\0';
    err_set(&err, E_NOTFOUND, "no such path: %s", path);
    CHECK(utf8_valid(err.msg));
    CHECK(strlen(err.msg) <= ERR_MSG_MAX - 1);
    CHECK(strlen(err.msg) >= ERR_MSG_MAX - 2);
    /* Every offset of a 4-byte character against the end of the buffer. */
    for (int shift = 0; shift < 4; shift++) {
        for (int i = 0; i < 200; i++) {
            memcpy(four + 1 + 4 * i, "\xf0\x9f\x98\x80", 4);
        }
        four[sizeof(four) - 1] = '\0';
        err_set(&err, E_INVALID, "%.*s%s", shift, "abc", four);
        CHECK(utf8_valid(err.msg));
        CHECK(strlen(err.msg) > ERR_MSG_MAX - 6);
    }
}

TEST(err_utf8_copy_replacement_fits_or_stops)
{
    char out[6];

    CHECK_EQ_INT(err_utf8_copy(out, sizeof(out), "ab\xff\xff", 4), 5);
    CHECK_EQ_STR(out, "ab\xef\xbf\xbd");
    CHECK_EQ_INT(err_utf8_copy(out, 1, "abc", 3), 0);
    CHECK_EQ_STR(out, "");
}

/* Runs FN with the log going to a temporary file; returns what was written (caller frees). */
static char *capture_log(enum log_format fmt, void (*fn)(void))
{
    FILE *f = tmpfile();
    char *out = xcalloc(1, 1 << 20);
    size_t n;

    ASSERT(f != NULL);
    log_set_format(fmt);
    log_set_fd(fileno(f));
    fn();
    log_set_fd(-1);
    log_set_format(LOG_FORMAT_TEXT);
    rewind(f);
    n = fread(out, 1, (1 << 20) - 1, f);
    out[n] = '\0';
    fclose(f);
    return out;
}

static void log_one(void)
{
    log_kv(LOG_INFO, "one", NULL);
}

/* The timestamp (formatted without gmtime_r) is the UTC time of the line: between the
 * times taken before and after it, as gmtime_r and strftime write them. Those are read
 * from the clock the log reads: time(NULL) is the coarse clock, up to a tick behind, so
 * a line written just after a second began could be "after" a time(NULL) taken later. */
TEST(log_timestamp_is_utc_now)
{
    char before[32], after[32];
    struct timespec t0, t1;
    struct tm tm;
    char *out;

    clock_gettime(CLOCK_REALTIME, &t0);
    out = capture_log(LOG_FORMAT_TEXT, log_one);
    clock_gettime(CLOCK_REALTIME, &t1);
    strftime(before, sizeof(before), "%Y-%m-%dT%H:%M:%S", gmtime_r(&t0.tv_sec, &tm));
    strftime(after, sizeof(after), "%Y-%m-%dT%H:%M:%S", gmtime_r(&t1.tv_sec, &tm));
    CHECK(strlen(out) > 24);
    CHECK(strncmp(out, before, 19) >= 0 && strncmp(out, after, 19) <= 0);
    CHECK(out[19] == '.' && out[23] == 'Z' && out[24] == ' ');
    free(out);
}

static char g_long[5000 + 1];

static void log_hostile(void)
{
    memset(g_long, 'a', sizeof(g_long) - 1);
    /* A multi-byte character across the LOG_VALUE_MAX boundary. */
    memcpy(g_long + LOG_VALUE_MAX - 1, "\xc3\xa9", 2);
    log_kv(LOG_INFO, "request", "path", "/x\r2026-11-30T00:00:00Z info admin_login", "esc",
           "\x1b[2J", "bad", "\xff\xfe", "c1",
           "\xc2\x9b"
           "31m",
           "del",
           "a\x7f"
           "b",
           "q", "\"\\", "ok", "caf\xc3\xa9", NULL);
    log_kv(LOG_WARN, "long", "path", g_long, "tail", "after", NULL);
}

TEST(log_json_lines_are_valid_json)
{
    char *out = capture_log(LOG_FORMAT_JSON, log_hostile);
    char *line = out, *nl;
    int lines = 0;

    while ((nl = strchr(line, '\n')) != NULL) {
        json_error_t jerr;
        json_t *j = json_loadb(line, (size_t)(nl - line), 0, &jerr);
        if (j == NULL) {
            t_fail(__FILE__, __LINE__, "line %d is not JSON: %s", lines + 1, jerr.text);
        } else if (lines == 0) {
            CHECK_EQ_STR(json_string_value(json_object_get(j, "path")),
                         "/x\r2026-11-30T00:00:00Z info admin_login");
            CHECK_EQ_STR(json_string_value(json_object_get(j, "esc")), "\x1b[2J");
            CHECK_EQ_STR(json_string_value(json_object_get(j, "bad")), "\xef\xbf\xbd\xef\xbf\xbd");
            CHECK_EQ_STR(json_string_value(json_object_get(j, "q")), "\"\\");
            CHECK_EQ_STR(json_string_value(json_object_get(j, "ok")), "caf\xc3\xa9");
        } else {
            const char *p = json_string_value(json_object_get(j, "path"));
            size_t n = p != NULL ? strlen(p) : 0;
            CHECK(n > strlen(LOG_TRUNCATED) && n <= LOG_VALUE_MAX + strlen(LOG_TRUNCATED));
            CHECK(n > 0 && strcmp(p + n - strlen(LOG_TRUNCATED), LOG_TRUNCATED) == 0);
            CHECK_EQ_STR(json_string_value(json_object_get(j, "tail")), "after");
        }
        json_decref(j);
        lines++;
        line = nl + 1;
    }
    CHECK_EQ_INT(lines, 2);
    CHECK_EQ_STR(line, "");
    free(out);
}

TEST(log_text_escapes_controls_and_bad_bytes)
{
    char *out = capture_log(LOG_FORMAT_TEXT, log_hostile);
    char *nl = strchr(out, '\n');

    CHECK(nl != NULL);
    CHECK(strchr(out, '\r') == NULL);
    CHECK(strchr(out, '\x1b') == NULL);
    CHECK(strchr(out, '\x7f') == NULL);
    CHECK(strstr(out, "\xc2\x9b") == NULL);
    CHECK(strstr(out, "\xff") == NULL);
    CHECK(strstr(out, "path=\"/x\\r2026-11-30T00:00:00Z info admin_login\"") != NULL);
    CHECK(strstr(out, "esc=\"\\x1b[2J\"") != NULL);
    CHECK(strstr(out, "bad=\"\\xff\\xfe\"") != NULL);
    CHECK(strstr(out, "c1=\"\\xc2\\x9b31m\"") != NULL);
    CHECK(strstr(out, "q=\"\\\"\\\\\"") != NULL);
    CHECK(strstr(out, "ok=caf\xc3\xa9") != NULL);
    CHECK(nl != NULL && strstr(nl + 1, LOG_TRUNCATED " tail=after\n") != NULL);
    free(out);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");

    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
    ASSERT(chmod(path, mode) == 0);
}

TEST(secret_file_refuses_what_others_could_plant)
{
    char dir[] = "/tmp/test_common.XXXXXX", good[64], loose[64], link_[64], fifo[64], other[64];
    char *s = NULL;
    bool created = false;
    struct err err = {0};
    struct stat st;

    ASSERT(mkdtemp(dir) != NULL);
    snprintf(good, sizeof(good), "%s/good", dir);
    snprintf(loose, sizeof(loose), "%s/loose", dir);
    snprintf(link_, sizeof(link_), "%s/link", dir);
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    snprintf(other, sizeof(other), "%s/other", dir);

    CHECK_OK(secret_file_load_or_create(&s, &created, good, 16, &err));
    CHECK(created && s != NULL && strlen(s) == 32);
    CHECK(stat(good, &st) == 0 && (st.st_mode & 0777) == 0600);
    free(s);
    CHECK_OK(secret_file_load_or_create(&s, &created, good, 16, &err));
    CHECK(!created);
    free(s);

    write_file(loose, "planted\n", 0644);
    CHECK_EQ_INT(secret_file_load_or_create(&s, NULL, loose, 16, &err), E_DENIED);
    CHECK(s == NULL && strstr(err.msg, "chmod 600") != NULL);
    CHECK(chmod(loose, 0620) == 0);
    CHECK_EQ_INT(secret_file_load_or_create(&s, NULL, loose, 16, &err), E_DENIED);

    CHECK(symlink(good, link_) == 0);
    CHECK_EQ_INT(secret_file_load_or_create(&s, NULL, link_, 16, &err), E_DENIED);
    CHECK(strstr(err.msg, "symbolic link") != NULL);

    CHECK(mkfifo(fifo, 0600) == 0); /* must not block */
    CHECK_EQ_INT(secret_file_load_or_create(&s, NULL, fifo, 16, &err), E_DENIED);
    CHECK(strstr(err.msg, "not a regular file") != NULL);

    if (geteuid() == 0) { /* only root can give a file away */
        write_file(other, "planted\n", 0600);
        CHECK(chown(other, 65534, 65534) == 0);
        CHECK_EQ_INT(secret_file_load_or_create(&s, NULL, other, 16, &err), E_DENIED);
        CHECK(strstr(err.msg, "chown 0") != NULL);
        unlink(other);
    }
    unlink(good);
    unlink(loose);
    unlink(link_);
    unlink(fifo);
    rmdir(dir);
}

/* A SpendQuota's period: the UTC calendar month (leap years, December, before 1970). */
TEST(clock_calendar_months)
{
    int64_t ms;

    CHECK_OK(clock_parse_rfc3339(&ms, "2024-02-29T23:59:59.999Z"));
    CHECK_EQ_INT(clock_month_start(ms), INT64_C(1706745600000)); /* 2024-02-01 */
    CHECK_EQ_INT(clock_next_month(ms), INT64_C(1709251200000));  /* 2024-03-01 */
    CHECK_OK(clock_parse_rfc3339(&ms, "2026-12-31T12:00:00Z"));
    CHECK_EQ_INT(clock_next_month(ms), INT64_C(1798761600000)); /* 2027-01-01 */
    CHECK_EQ_INT(clock_month_start(clock_next_month(ms)), clock_next_month(ms));
    CHECK_EQ_INT(clock_month_start(-1), INT64_C(-2678400000)); /* 1969-12-01 */
}

T_MAIN
