/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the ConnectRPC protobuf codec (server/connect_pb.c, connect_json.c),
 * which reads untrusted request bodies. The first byte picks a message of
 * connect_request_msgs and the codec (high bit: proto3 JSON text, else binary); the rest
 * is the body. Whatever decodes must survive a round trip unchanged: encode, decode again,
 * and the proto3 JSON of both decodings must be equal; JSON output read back must decode
 * to the same. Sanitizers catch any read outside the buffer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "server/api/connect/connect_pb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t msg_count(void)
{
    size_t n = 0;

    while (connect_request_msgs[n] != NULL) {
        n++;
    }
    return n;
}

static void check_equal(const json_t *a, const json_t *b)
{
    char *x = json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS);
    char *y = json_dumps(b, JSON_COMPACT | JSON_SORT_KEYS);

    if (x == NULL || y == NULL || strcmp(x, y) != 0) {
        abort();
    }
    free(x);
    free(y);
}

/* DOC decoded fine: its binary form must decode to the same, and its JSON form must read
 * back to the same. */
static void round_trip(const struct pb_message *m, const json_t *doc)
{
    json_t *again = NULL, *w1, *w2, *read = NULL;
    struct err err = {0};
    struct buf out;

    buf_init(&out, 0);
    if (pb_encode(&out, m, doc, &err) != E_OK ||
        pb_decode(&again, m, out.data, out.len, &err) != E_OK) {
        abort();
    }
    w1 = pb_json_write(m, doc);
    w2 = pb_json_write(m, again);
    check_equal(w1, w2);
    if (pb_json_read(&read, m, w1, &err) != E_OK) {
        abort();
    }
    json_decref(w2);
    w2 = pb_json_write(m, read);
    check_equal(w1, w2);
    json_decref(read);
    json_decref(w1);
    json_decref(w2);
    json_decref(again);
    buf_cleanup(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const struct pb_message *m;
    json_t *doc = NULL;
    struct err err = {0};

    if (size < 1) {
        return 0;
    }
    m = connect_request_msgs[(data[0] & 0x7f) % msg_count()];
    if ((data[0] & 0x80) != 0) {
        json_t *in = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, NULL);
        if (in != NULL && pb_json_read(&doc, m, in, &err) == E_OK) {
            round_trip(m, doc);
        }
        json_decref(in);
    } else if (pb_decode(&doc, m, data + 1, size - 1, &err) == E_OK) {
        round_trip(m, doc);
    }
    json_decref(doc);
    return 0;
}
