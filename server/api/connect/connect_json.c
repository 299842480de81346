/* SPDX-License-Identifier: Apache-2.0 */
/* The proto3 JSON mapping of connect_pb.h: reading a client's JSON into the canonical
 * form (strict types, unknown fields refused) and writing the canonical form out (int64
 * as strings, defaults left out). */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/connect/connect_pb.h"

static const struct pb_field *field_by_key(const struct pb_message *msg, const char *key)
{
    for (size_t i = 0; i < msg->nfields; i++) {
        if (strcmp(msg->fields[i].json_name, key) == 0 ||
            strcmp(msg->fields[i].proto_name, key) == 0) {
            return &msg->fields[i];
        }
    }
    return NULL;
}

/* PATH of field F under PREFIX ("" at the top) into OUT. */
static void field_path(char *out, size_t cap, const char *prefix, const struct pb_field *f)
{
    snprintf(out, cap, "%s%s%s", prefix, prefix[0] != '\0' ? "." : "", f->json_name);
}

/* An int64 in proto3 JSON: a JSON integer, an integral JSON number, or a decimal string
 * ("-12"; no spaces, no '+', no exponent). */
static int read_int64(int64_t *out, const json_t *v)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return E_OK;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        /* -2^63 <= d < 2^63 before the cast: outside that it is undefined. */
        if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && (double)(int64_t)d == d) {
            *out = (int64_t)d;
            return E_OK;
        }
        return E_INVALID;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v), *p = s[0] == '-' ? s + 1 : s;
        char *end = NULL;
        long long n;

        if (*p < '0' || *p > '9' || json_string_length(v) > 20) {
            return E_INVALID;
        }
        errno = 0;
        n = strtoll(s, &end, 10);
        if (errno != 0 || end == NULL || *end != '\0') {
            return E_INVALID;
        }
        *out = (int64_t)n;
        return E_OK;
    }
    return E_INVALID;
}

static int read_message(json_t **out, const struct pb_message *msg, const json_t *in,
                        const char *path, int depth, struct err *err);

static int read_value(json_t **out, const struct pb_field *f, const json_t *v, const char *path,
                      int depth, struct err *err)
{
    int64_t n = 0;

    *out = NULL;
    switch (f->type) {
    case PB_STRING:
        if (!json_is_string(v)) {
            return err_set_field(err, E_INVALID, path, "%s: must be a string", path);
        }
        *out = json_incref((json_t *)(uintptr_t)v);
        return E_OK;
    case PB_INT64:
        if (read_int64(&n, v) != E_OK) {
            return err_set_field(err, E_INVALID, path,
                                 "%s: must be a 64-bit integer (a number or a decimal string)",
                                 path);
        }
        *out = json_integer((json_int_t)n);
        return E_OK;
    case PB_BOOL:
        if (!json_is_boolean(v)) {
            return err_set_field(err, E_INVALID, path, "%s: must be true or false", path);
        }
        *out = json_boolean(json_is_true(v));
        return E_OK;
    case PB_MESSAGE:
        return read_message(out, f->message, v, path, depth + 1, err);
    }
    return err_set_field(err, E_INVALID, path, "%s: unsupported type", path);
}

static int read_member(json_t *obj, const struct pb_field *f, const json_t *v, const char *prefix,
                       int depth, struct err *err)
{
    char path[256], ipath[300];
    json_t *val = NULL, *arr;
    const json_t *item;
    size_t i;
    int rc;

    field_path(path, sizeof(path), prefix, f);
    if ((f->flags & PB_REPEATED) == 0) {
        rc = read_value(&val, f, v, path, depth, err);
        if (rc == E_OK) {
            json_object_set_new(obj, f->json_name, val);
        }
        return rc;
    }
    if (!json_is_array(v)) {
        return err_set_field(err, E_INVALID, path, "%s: must be a list", path);
    }
    if (json_array_size(v) > PB_REPEATED_MAX) {
        return err_set_field(err, E_INVALID, path, "%s: more than %d elements", path,
                             PB_REPEATED_MAX);
    }
    arr = json_array();
    json_object_set_new(obj, f->json_name, arr);
    json_array_foreach(v, i, item)
    {
        snprintf(ipath, sizeof(ipath), "%s[%zu]", path, i);
        rc = read_value(&val, f, item, ipath, depth, err);
        if (rc != E_OK) {
            return rc;
        }
        json_array_append_new(arr, val);
    }
    return E_OK;
}

static int read_message(json_t **out, const struct pb_message *msg, const json_t *in,
                        const char *path, int depth, struct err *err)
{
    const char *key;
    json_t *v, *obj;
    int rc = E_OK;

    *out = NULL;
    if (depth >= PB_DEPTH_MAX) {
        return err_set_field(err, E_INVALID, path, "%s: nested too deep", path);
    }
    if (!json_is_object(in)) {
        return err_set_field(err, E_INVALID, path, "%s: must be an object",
                             path[0] != '\0' ? path : "the request");
    }
    obj = json_object();
    json_object_foreach((json_t *)(uintptr_t)in, key, v)
    {
        const struct pb_field *f = field_by_key(msg, key);
        if (f == NULL) {
            /* The key itself is request bytes: not quoted. */
            rc = err_set_field(err, E_INVALID, path, "%s%sunknown field in %s", path,
                               path[0] != '\0' ? ": " : "", msg->full_name);
            break;
        }
        if (json_object_get(obj, f->json_name) != NULL) {
            char p[256];
            field_path(p, sizeof(p), path, f);
            rc = err_set_field(err, E_INVALID, p, "%s: given twice", p);
            break;
        }
        if (json_is_null(v)) {
            continue; /* null: the default */
        }
        rc = read_member(obj, f, v, path, depth, err);
        if (rc != E_OK) {
            break;
        }
    }
    if (rc != E_OK) {
        json_decref(obj);
        return rc;
    }
    *out = obj;
    return E_OK;
}

int pb_json_read(json_t **out, const struct pb_message *msg, const json_t *in, struct err *err)
{
    return read_message(out, msg, in, "", 0, err);
}

static json_t *write_value(const struct pb_field *f, const json_t *v, int depth);

static json_t *write_message(const struct pb_message *msg, const json_t *obj, int depth)
{
    json_t *out = json_object();

    if (depth >= PB_DEPTH_MAX || !json_is_object(obj)) {
        return out;
    }
    for (size_t i = 0; i < msg->nfields; i++) {
        const struct pb_field *f = &msg->fields[i];
        const json_t *v = json_object_get(obj, f->json_name), *item;
        json_t *w;
        size_t j;

        if (v == NULL) {
            continue;
        }
        if ((f->flags & PB_REPEATED) != 0) {
            if (!json_is_array(v) || json_array_size(v) == 0) {
                continue;
            }
            w = json_array();
            json_array_foreach(v, j, item)
            {
                json_t *e = write_value(f, item, depth);
                if (e != NULL) {
                    json_array_append_new(w, e);
                }
            }
        } else {
            w = write_value(f, v, depth);
        }
        if (w != NULL) {
            json_object_set_new(out, f->json_name, w);
        }
    }
    return out;
}

static json_t *write_value(const struct pb_field *f, const json_t *v, int depth)
{
    bool keep_zero = (f->flags & PB_OPTIONAL) != 0;
    char num[32];

    switch (f->type) {
    case PB_STRING:
        if (!json_is_string(v) || (json_string_length(v) == 0 && !keep_zero)) {
            return NULL;
        }
        return json_incref((json_t *)(uintptr_t)v);
    case PB_INT64:
        if (!json_is_integer(v) || (json_integer_value(v) == 0 && !keep_zero)) {
            return NULL;
        }
        snprintf(num, sizeof(num), "%" PRId64, (int64_t)json_integer_value(v));
        return json_string(num);
    case PB_BOOL:
        if (!json_is_boolean(v) || (!json_is_true(v) && !keep_zero)) {
            return NULL;
        }
        return json_boolean(json_is_true(v));
    case PB_MESSAGE:
        return json_is_object(v) ? write_message(f->message, v, depth + 1) : NULL;
    }
    return NULL;
}

json_t *pb_json_write(const struct pb_message *msg, const json_t *obj)
{
    return write_message(msg, obj, 0);
}
