/* SPDX-License-Identifier: Apache-2.0 */
/* The protobuf codec of connect_pb.h. The binary reader is the one place that parses
 * untrusted protobuf bytes: every read is checked against the end of its buffer first,
 * lengths are compared with what is left before anything is used, and nesting is
 * bounded, so no input makes it read outside the buffer or recurse without limit. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/connect/connect_pb.h"

enum pb_wire {
    WIRE_VARINT = 0,
    WIRE_I64 = 1,
    WIRE_LEN = 2,
    WIRE_SGROUP = 3,
    WIRE_EGROUP = 4,
    WIRE_I32 = 5,
};

struct reader {
    const uint8_t *p;   /* next byte */
    const uint8_t *end; /* one past the last byte */
};

static const struct pb_field *field_by_number(const struct pb_message *msg, uint32_t number)
{
    for (size_t i = 0; i < msg->nfields; i++) {
        if (msg->fields[i].number == number) {
            return &msg->fields[i];
        }
    }
    return NULL;
}

static enum pb_wire wire_of(const struct pb_field *f)
{
    return f->type == PB_STRING || f->type == PB_MESSAGE ? WIRE_LEN : WIRE_VARINT;
}

/* --- reading ------------------------------------------------------------------------ */

static int read_varint(uint64_t *out, struct reader *r, struct err *err)
{
    uint64_t v = 0;

    for (unsigned i = 0; i < 10; i++) {
        uint8_t b;
        if (r->p >= r->end) {
            return err_set(err, E_INVALID, "protobuf: truncated varint");
        }
        b = *r->p++;
        /* The tenth byte holds bit 63 only. */
        if (i == 9 && b > 1) {
            return err_set(err, E_INVALID, "protobuf: varint longer than 64 bits");
        }
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if ((b & 0x80) == 0) {
            *out = v;
            return E_OK;
        }
    }
    return err_set(err, E_INVALID, "protobuf: varint longer than 10 bytes");
}

/* Reads a length prefix and checks that many bytes are left; *out then points at them. */
static int read_len(struct reader *out, struct reader *r, struct err *err)
{
    uint64_t n = 0;
    int rc = read_varint(&n, r, err);

    if (rc != E_OK) {
        return rc;
    }
    if (n > (uint64_t)(r->end - r->p)) {
        return err_set(err, E_INVALID, "protobuf: length past the end of the buffer");
    }
    out->p = r->p;
    out->end = r->p + n;
    r->p += n;
    return E_OK;
}

static int read_tag(uint32_t *number, enum pb_wire *wire, struct reader *r, struct err *err)
{
    uint64_t tag = 0;
    int rc = read_varint(&tag, r, err);

    if (rc != E_OK) {
        return rc;
    }
    if (tag > UINT32_MAX || (tag >> 3) == 0) {
        return err_set(err, E_INVALID, "protobuf: invalid field number");
    }
    *number = (uint32_t)(tag >> 3);
    *wire = (enum pb_wire)(tag & 7);
    return E_OK;
}

static int skip_field(struct reader *r, uint32_t number, enum pb_wire wire, int depth,
                      struct err *err)
{
    struct reader sub;
    uint64_t v;

    switch (wire) {
    case WIRE_VARINT:
        return read_varint(&v, r, err);
    case WIRE_I64:
    case WIRE_I32: {
        size_t n = wire == WIRE_I64 ? 8 : 4;
        if ((size_t)(r->end - r->p) < n) {
            return err_set(err, E_INVALID, "protobuf: truncated fixed-size field");
        }
        r->p += n;
        return E_OK;
    }
    case WIRE_LEN:
        return read_len(&sub, r, err);
    case WIRE_SGROUP:
        if (depth >= PB_DEPTH_MAX) {
            return err_set(err, E_INVALID, "protobuf: nested deeper than %d", PB_DEPTH_MAX);
        }
        for (;;) {
            uint32_t n;
            enum pb_wire w;
            int rc = read_tag(&n, &w, r, err);
            if (rc != E_OK) {
                return rc;
            }
            if (w == WIRE_EGROUP) {
                return n == number ? E_OK
                                   : err_set(err, E_INVALID, "protobuf: mismatched end group");
            }
            rc = skip_field(r, n, w, depth + 1, err);
            if (rc != E_OK) {
                return rc;
            }
        }
    case WIRE_EGROUP:
        return err_set(err, E_INVALID, "protobuf: end group without a start");
    }
    return err_set(err, E_INVALID, "protobuf: invalid wire type");
}

static json_t *string_of(const uint8_t *p, size_t n)
{
    if (memchr(p, '\0', n) != NULL) {
        return NULL;
    }
    return json_stringn((const char *)p, n); /* NULL when not UTF-8 */
}

static int decode_into(json_t *obj, const struct pb_message *msg, struct reader *r, int depth,
                       struct err *err);

static int decode_message_field(json_t *obj, const struct pb_field *f, struct reader *sub,
                                int depth, struct err *err)
{
    json_t *cur = json_object_get(obj, f->json_name);
    json_t *item;
    int rc;

    if (depth >= PB_DEPTH_MAX) {
        return err_set(err, E_INVALID, "protobuf: nested deeper than %d", PB_DEPTH_MAX);
    }
    if ((f->flags & PB_REPEATED) != 0) {
        if (cur == NULL) {
            cur = json_array();
            json_object_set_new(obj, f->json_name, cur);
        }
        if (json_array_size(cur) >= PB_REPEATED_MAX) {
            return err_set(err, E_INVALID, "protobuf: %s has more than %d elements", f->json_name,
                           PB_REPEATED_MAX);
        }
        item = json_object();
        json_array_append_new(cur, item);
        return decode_into(item, f->message, sub, depth + 1, err);
    }
    /* A message field seen again is merged into the first one (protobuf semantics). */
    if (cur == NULL) {
        cur = json_object();
        json_object_set_new(obj, f->json_name, cur);
    }
    rc = decode_into(cur, f->message, sub, depth + 1, err);
    return rc;
}

static int decode_field(json_t *obj, const struct pb_field *f, struct reader *r, int depth,
                        struct err *err)
{
    struct reader sub;
    uint64_t v = 0;
    json_t *s;
    int rc;

    if (f->type == PB_STRING || f->type == PB_MESSAGE) {
        rc = read_len(&sub, r, err);
        if (rc != E_OK) {
            return rc;
        }
        if (f->type == PB_MESSAGE) {
            return decode_message_field(obj, f, &sub, depth, err);
        }
        s = string_of(sub.p, (size_t)(sub.end - sub.p));
        if (s == NULL) {
            return err_set(err, E_INVALID, "protobuf: %s is not UTF-8 text without NUL bytes",
                           f->json_name);
        }
        json_object_set_new(obj, f->json_name, s);
        return E_OK;
    }
    rc = read_varint(&v, r, err);
    if (rc != E_OK) {
        return rc;
    }
    if (f->type == PB_BOOL) {
        json_object_set_new(obj, f->json_name, json_boolean(v != 0));
    } else {
        /* int64 on the wire: the two's complement bits of the value. */
        json_object_set_new(obj, f->json_name, json_integer((json_int_t)(int64_t)v));
    }
    return E_OK;
}

static int decode_into(json_t *obj, const struct pb_message *msg, struct reader *r, int depth,
                       struct err *err)
{
    while (r->p < r->end) {
        uint32_t number;
        enum pb_wire wire;
        const struct pb_field *f;
        int rc = read_tag(&number, &wire, r, err);

        if (rc != E_OK) {
            return rc;
        }
        f = field_by_number(msg, number);
        if (f == NULL || wire != wire_of(f)) {
            rc = skip_field(r, number, wire, depth, err); /* unknown: skipped */
        } else {
            rc = decode_field(obj, f, r, depth, err);
        }
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

int pb_decode(json_t **out, const struct pb_message *msg, const void *data, size_t len,
              struct err *err)
{
    const uint8_t *p = data != NULL ? data : (const uint8_t *)"";
    struct reader r = {.p = p, .end = p + (data != NULL ? len : 0)};
    json_t *obj = json_object();
    int rc = decode_into(obj, msg, &r, 0, err);

    *out = NULL;
    if (rc != E_OK) {
        json_decref(obj);
        return rc;
    }
    *out = obj;
    return E_OK;
}

/* --- writing ------------------------------------------------------------------------ */

static int put_varint(struct buf *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;

    do {
        tmp[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v != 0) {
            tmp[n] |= 0x80;
        }
        n++;
    } while (v != 0);
    return buf_append(b, tmp, n);
}

static int put_tag(struct buf *b, const struct pb_field *f)
{
    return put_varint(b, ((uint64_t)f->number << 3) | (uint64_t)wire_of(f));
}

static int put_bytes(struct buf *b, const struct pb_field *f, const void *data, size_t n)
{
    int rc = put_tag(b, f);

    rc = rc != E_OK ? rc : put_varint(b, n);
    return rc != E_OK ? rc : buf_append(b, data, n);
}

static int encode_message(struct buf *out, const struct pb_message *msg, const json_t *obj,
                          int depth, struct err *err);

static int encode_sub(struct buf *out, const struct pb_field *f, const json_t *v, int depth,
                      struct err *err)
{
    struct buf tmp;
    int rc;

    buf_init(&tmp, out->max);
    rc = encode_message(&tmp, f->message, v, depth + 1, err);
    if (rc == E_OK) {
        rc = put_bytes(out, f, tmp.data != NULL ? tmp.data : "", tmp.len);
    }
    buf_cleanup(&tmp);
    return rc;
}

static int encode_field(struct buf *out, const struct pb_field *f, const json_t *v, int depth,
                        struct err *err)
{
    bool keep_zero = (f->flags & PB_OPTIONAL) != 0;

    switch (f->type) {
    case PB_STRING:
        if (!json_is_string(v)) {
            break;
        }
        if (json_string_length(v) == 0 && !keep_zero) {
            return E_OK;
        }
        return put_bytes(out, f, json_string_value(v), json_string_length(v));
    case PB_INT64:
        if (!json_is_integer(v)) {
            break;
        }
        if (json_integer_value(v) == 0 && !keep_zero) {
            return E_OK;
        }
        return put_tag(out, f) != E_OK ? E_TOOBIG
                                       : put_varint(out, (uint64_t)(int64_t)json_integer_value(v));
    case PB_BOOL:
        if (!json_is_boolean(v)) {
            break;
        }
        if (!json_is_true(v) && !keep_zero) {
            return E_OK;
        }
        return put_tag(out, f) != E_OK ? E_TOOBIG : put_varint(out, json_is_true(v) ? 1 : 0);
    case PB_MESSAGE:
        if (!json_is_object(v)) {
            break;
        }
        return encode_sub(out, f, v, depth, err);
    }
    return err_set(err, E_INVALID, "protobuf: %s has the wrong type", f->json_name);
}

static int encode_message(struct buf *out, const struct pb_message *msg, const json_t *obj,
                          int depth, struct err *err)
{
    if (depth >= PB_DEPTH_MAX || !json_is_object(obj)) {
        return err_set(err, E_INVALID, "protobuf: %s is not a message object", msg->full_name);
    }
    for (size_t i = 0; i < msg->nfields; i++) {
        const struct pb_field *f = &msg->fields[i];
        const json_t *v = json_object_get(obj, f->json_name);
        const json_t *item;
        size_t j;
        int rc = E_OK;

        if (v == NULL || json_is_null(v)) {
            continue;
        }
        if ((f->flags & PB_REPEATED) != 0) {
            if (!json_is_array(v)) {
                return err_set(err, E_INVALID, "protobuf: %s must be a list", f->json_name);
            }
            json_array_foreach(v, j, item)
            {
                rc = rc != E_OK ? rc : encode_field(out, f, item, depth, err);
            }
        } else {
            rc = encode_field(out, f, v, depth, err);
        }
        if (rc != E_OK) {
            return rc == E_TOOBIG ? err_set(err, E_TOOBIG, "protobuf: message too large") : rc;
        }
    }
    return E_OK;
}

int pb_encode(struct buf *out, const struct pb_message *msg, const json_t *obj, struct err *err)
{
    return encode_message(out, msg, obj, 0, err);
}
