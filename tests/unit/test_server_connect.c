/* SPDX-License-Identifier: Apache-2.0 */
/* The ConnectRPC protobuf codec (server/connect_pb.c, connect_json.c): wire format by
 * hand-made bytes, unknown fields of every wire type, every malformed-input check, and
 * the proto3 JSON mapping. */
#include <string.h>

#include "server/api/connect/connect_pb.h"
#include "tests/t_check.h"

#define BYTES(s_) (s_), (sizeof(s_) - 1)

static int decode(json_t **out, const struct pb_message *m, const char *data, size_t n)
{
    struct err err = {0};
    return pb_decode(out, m, data, n, &err);
}

static char *dump(const json_t *j)
{
    return json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
}

static void check_json(const json_t *j, const char *want)
{
    char *s = dump(j);
    CHECK_EQ_STR(s, want);
    free(s);
}

TEST(decode_known_bytes)
{
    /* name="a" (1), iteration=300 (7), suspended=true (14), repository{url="u"} (13),
     * budgetTokens=-1 (12: ten-byte varint). */
    static const char in[] = "\x0a\x01"
                             "a"
                             "\x38\xac\x02"
                             "\x70\x01"
                             "\x6a\x03\x0a\x01"
                             "u"
                             "\x60\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";
    json_t *t = NULL;

    CHECK_OK(decode(&t, &connect_msg_task, BYTES(in)));
    check_json(t, "{\"budgetTokens\":-1,\"iteration\":300,\"name\":\"a\",\"repository\":"
                  "{\"url\":\"u\"},\"suspended\":true}");
    json_decref(t);
}

TEST(unknown_fields_of_every_wire_type_are_skipped)
{
    static const char in[] = "\xa8\x06\x05"                             /* 101 varint */
                             "\xb1\x06\x01\x02\x03\x04\x05\x06\x07\x08" /* 102 i64 */
                             "\xba\x06\x02xy"                           /* 103 len */
                             "\xc5\x06\x01\x02\x03\x04"                 /* 104 i32 */
                             "\xcb\x06\xd3\x06\xd4\x06\x08\x01\xcc\x06" /* 105 group{106{}} */
                             "\x12\x01n"                                /* name (2) */
                             "\x38\x05"; /* iteration (7) as varint */
    json_t *t = NULL;

    CHECK_OK(decode(&t, &connect_msg_get_req, BYTES(in)));
    check_json(t, "{\"name\":\"n\"}");
    json_decref(t);
}

TEST(known_field_with_other_wire_type_is_skipped)
{
    /* name (2) sent as a varint: not a string, skipped as unknown. */
    json_t *t = NULL;

    CHECK_OK(decode(&t, &connect_msg_get_req, BYTES("\x10\x05\x0a\x01x")));
    check_json(t, "{\"namespace\":\"x\"}");
    json_decref(t);
}

TEST(last_scalar_wins_and_messages_merge)
{
    static const char in[] = "\x0a\x01"
                             "a\x0a\x01"
                             "b"
                             "\x6a\x03\x0a\x01u"
                             "\x6a\x03\x12\x01m";
    json_t *t = NULL;

    CHECK_OK(decode(&t, &connect_msg_task, BYTES(in)));
    check_json(t, "{\"name\":\"b\",\"repository\":{\"baseBranch\":\"m\",\"url\":\"u\"}}");
    json_decref(t);
}

TEST(malformed_input_is_refused)
{
    static const struct {
        const char *data;
        size_t len;
    } bad[] = {
        {"\x38", 1},                                              /* truncated varint */
        {"\x38\x80\x80", 3},                                      /* truncated varint */
        {"\x38\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02", 11},     /* > 64 bits */
        {"\x38\xff\xff\xff\xff\xff\xff\xff\xff\xff\x80\x01", 12}, /* 11 bytes */
        {"\x0a\x05"
         "ab",
         4},                             /* length past the end */
        {"\x0a\xff\xff\xff\xff\x0f", 6}, /* huge length */
        {"\x00\x01", 2},                 /* field number 0 */
        {"\x0e", 1},                     /* wire type 6 */
        {"\x0f", 1},                     /* wire type 7 */
        {"\xcc\x06", 2},                 /* end group without start */
        {"\xcb\x06\xd4\x06", 4},         /* mismatched end group */
        {"\xcb\x06", 2},                 /* group never ended */
        {"\xb1\x06\x01\x02", 4},         /* truncated i64 */
        {"\xc5\x06\x01", 3},             /* truncated i32 */
        {"\x0a\x02\xc3\x28", 4},         /* not UTF-8 */
        {"\x0a\x03"
         "a\0b",
         5},                             /* NUL in a string */
        {"\x80\x80\x80\x80\x80\x01", 6}, /* tag past 32 bits */
    };

    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        json_t *t = NULL;
        struct err err = {0};
        CHECK_EQ_INT(pb_decode(&t, &connect_msg_task, bad[i].data, bad[i].len, &err), E_INVALID);
        CHECK(t == NULL);
        CHECK(strlen(err.msg) > 0);
    }
}

TEST(nesting_is_bounded)
{
    char in[2 * (PB_DEPTH_MAX + 2) * 2];
    size_t n = 0;
    json_t *t = NULL;

    /* Groups nested one past the limit inside an unknown field. */
    for (int i = 0; i <= PB_DEPTH_MAX; i++) {
        in[n++] = (char)0xcb;
        in[n++] = 0x06;
    }
    for (int i = 0; i <= PB_DEPTH_MAX; i++) {
        in[n++] = (char)0xcc;
        in[n++] = 0x06;
    }
    CHECK_EQ_INT(decode(&t, &connect_msg_task, in, n), E_INVALID);
    /* One level less is fine. */
    CHECK_OK(decode(&t, &connect_msg_task, in + 2, n - 4));
    json_decref(t);
}

TEST(empty_input_is_the_empty_message)
{
    json_t *t = NULL;

    CHECK_OK(decode(&t, &connect_msg_list_req, NULL, 0));
    check_json(t, "{}");
    json_decref(t);
}

TEST(encode_round_trips_and_omits_defaults)
{
    json_t *in =
        json_pack("{s:[{s:s, s:s, s:I, s:I, s:b, s:{s:s}, s:s}, {s:s}]}", "tasks", "name", "a",
                  "costUSD", "0.05", "iteration", (json_int_t)3, "budgetTokens", (json_int_t)-7,
                  "suspended", 1, "repository", "url", "u", "phase", "", "name", "b");
    json_t *back = NULL;
    struct buf out;
    struct err err = {0};

    buf_init(&out, 0);
    CHECK_OK(pb_encode(&out, &connect_msg_list_resp, in, &err));
    CHECK_OK(decode(&back, &connect_msg_list_resp, out.data, out.len));
    /* phase "" is the default: not sent, so not read back. */
    check_json(back, "{\"tasks\":[{\"budgetTokens\":-7,\"costUSD\":\"0.05\",\"iteration\":3,"
                     "\"name\":\"a\",\"repository\":{\"url\":\"u\"},\"suspended\":true},"
                     "{\"name\":\"b\"}]}");
    json_decref(back);
    json_decref(in);
    buf_cleanup(&out);
}

TEST(optional_zero_is_sent)
{
    json_t *in =
        json_pack("{s:I, s:I}", "budgetTokens", (json_int_t)0, "maxIterations", (json_int_t)0);
    struct buf out;
    struct err err = {0};

    buf_init(&out, 0);
    CHECK_OK(pb_encode(&out, &connect_msg_create_req, in, &err));
    CHECK_EQ_INT(out.len, 4);
    CHECK(out.len == 4 && memcmp(out.data, "\x28\x00\x30\x00", 4) == 0);
    json_decref(in);
    buf_cleanup(&out);
}

static int json_read(json_t **out, const struct pb_message *m, const char *text, struct err *err)
{
    json_t *in = json_loads(text, 0, NULL);
    int rc;

    ASSERT(in != NULL);
    rc = pb_json_read(out, m, in, err);
    json_decref(in);
    return rc;
}

TEST(json_read_accepts_proto3_forms)
{
    json_t *t = NULL;
    struct err err = {0};

    CHECK_OK(json_read(&t, &connect_msg_create_req,
                       "{\"name\":\"a\",\"budget_usd\":\"1.5\",\"budgetTokens\":\"-12\","
                       "\"maxIterations\":1e2,\"repository\":{\"base_branch\":\"m\"},"
                       "\"objective\":null}",
                       &err));
    check_json(t, "{\"budgetTokens\":-12,\"budgetUSD\":\"1.5\",\"maxIterations\":100,\"name\":"
                  "\"a\",\"repository\":{\"baseBranch\":\"m\"}}");
    json_decref(t);
}

TEST(json_read_refuses_bad_input)
{
    static const char *const bad[] = {
        "{\"bogus\":1}",
        "{\"name\":1}",
        "{\"budgetTokens\":1.5}",
        "{\"budgetTokens\":\"9223372036854775808\"}",
        "{\"budgetTokens\":\" 1\"}",
        "{\"budgetTokens\":\"+1\"}",
        "{\"budgetTokens\":1e300}",
        "{\"budgetTokens\":true}",
        "{\"repository\":\"u\"}",
        "{\"repository\":{\"url\":[]}}",
        "{\"budgetUSD\":\"1\",\"budget_usd\":\"2\"}",
        "[]",
    };

    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        json_t *t = NULL;
        struct err err = {0};
        CHECK_EQ_INT(json_read(&t, &connect_msg_create_req, bad[i], &err), E_INVALID);
        CHECK(t == NULL);
    }
}

TEST(json_read_names_the_field)
{
    json_t *t = NULL;
    struct err err = {0};

    CHECK_EQ_INT(json_read(&t, &connect_msg_create_req, "{\"repository\":{\"url\":5}}", &err),
                 E_INVALID);
    CHECK_EQ_STR(err.field, "repository.url");
    CHECK_EQ_INT(
        json_read(&t, &connect_msg_list_resp, "{\"tasks\":[{},{\"iteration\":\"x\"}]}", &err),
        E_INVALID);
    CHECK_EQ_STR(err.field, "tasks[1].iteration");
}

TEST(json_write_uses_proto3_mapping)
{
    json_t *in = json_pack("{s:s, s:I, s:I, s:b, s:s, s:{}}", "name", "a", "iteration",
                           (json_int_t)9007199254740993LL, "tokensConsumed", (json_int_t)0,
                           "suspended", 0, "phase", "", "repository");
    json_t *out = pb_json_write(&connect_msg_task, in);

    check_json(out, "{\"iteration\":\"9007199254740993\",\"name\":\"a\",\"repository\":{}}");
    json_decref(out);
    json_decref(in);
    in = json_pack("{s:I}", "tokens", (json_int_t)0);
    out = pb_json_write(&connect_msg_resume_req, in);
    check_json(out, "{\"tokens\":\"0\"}");
    json_decref(out);
    json_decref(in);
}

T_MAIN
