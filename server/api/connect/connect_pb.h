/* SPDX-License-Identifier: Apache-2.0 */
/* A small table-driven protobuf codec for the few messages of the ConnectRPC service
 * (proto/divergedev/agenttask/v1/agenttask.proto): the binary wire format and the proto3
 * JSON mapping, both to and from one "canonical" JSON form that the handlers use. Only
 * what those messages need: string, int64, bool and message fields, repeated messages,
 * proto3 `optional`. Shared inside server/ (api_connect.c, tests, fuzz target). */
#ifndef DIVERGE_SERVER_CONNECT_PB_H
#define DIVERGE_SERVER_CONNECT_PB_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"

#define PB_DEPTH_MAX 16       /* nesting of messages (and groups being skipped) */
#define PB_REPEATED_MAX 10000 /* elements of one repeated field */

enum pb_type {
    PB_STRING, /* UTF-8 without NUL bytes */
    PB_INT64,
    PB_BOOL,
    PB_MESSAGE,
};

#define PB_REPEATED 1u /* repeated (messages only) */
#define PB_OPTIONAL 2u /* proto3 `optional`: explicit presence, a zero value is sent */

struct pb_message;

struct pb_field {
    uint32_t number; /* field number */
    enum pb_type type;
    unsigned flags;                   /* PB_REPEATED | PB_OPTIONAL */
    const char *json_name;            /* lowerCamelCase (or json_name); the canonical key */
    const char *proto_name;           /* snake_case, also accepted in JSON input */
    const struct pb_message *message; /* PB_MESSAGE: the field's type */
};

struct pb_message {
    const char *full_name;         /* "divergedev.agenttask.v1.Task" */
    const struct pb_field *fields; /* sorted by number */
    size_t nfields;
};

/* The canonical form of a message is a JSON object with one member per field present,
 * keyed by json_name: strings as strings, int64 as integers, bools as booleans, messages
 * as objects, repeated fields as arrays. A field absent from the object has its default. */

/* Decodes the protobuf binary DATA (LEN bytes) of MSG into *out, a new canonical object
 * (caller json_decref()s). Fields of unknown numbers (or of a wire type their field does
 * not have) are skipped, groups included; a scalar seen twice keeps the last value; a
 * message seen twice is merged. Never reads outside DATA. E_INVALID on a malformed
 * buffer (truncated, bad varint or wire type, length past the end, field number 0,
 * strings that are not UTF-8 or hold a NUL, nesting past PB_DEPTH_MAX, more than
 * PB_REPEATED_MAX elements); the message never quotes the input. */
int pb_decode(json_t **out, const struct pb_message *msg, const void *data, size_t len,
              struct err *err);

/* Appends the protobuf binary form of the canonical object OBJ (borrowed) of MSG to OUT:
 * fields in number order, default values left out except for PB_OPTIONAL fields present.
 * E_INVALID when OBJ is not canonical; E_TOOBIG when OUT's cap is reached. */
int pb_encode(struct buf *out, const struct pb_message *msg, const json_t *obj, struct err *err);

/* Reads the proto3 JSON form IN (borrowed) of MSG into *out, a new canonical object.
 * Keys may be json names or proto names; null means the default; int64 may be a JSON
 * number (integral) or a decimal string. E_INVALID naming the field path for unknown
 * fields, wrong types or a field given twice; the message never quotes the input. */
int pb_json_read(json_t **out, const struct pb_message *msg, const json_t *in, struct err *err);

/* Returns the proto3 JSON form (new object) of the canonical object OBJ of MSG: json
 * names, int64 as decimal strings, default values left out (PB_OPTIONAL fields present
 * are kept). Members that are not canonical are left out. */
json_t *pb_json_write(const struct pb_message *msg, const json_t *obj);

/* --- the messages of divergedev.agenttask.v1 (connect_msgs.c) --- */
extern const struct pb_message connect_msg_repository;
extern const struct pb_message connect_msg_task;
extern const struct pb_message connect_msg_create_req;
extern const struct pb_message connect_msg_get_req;
extern const struct pb_message connect_msg_list_req;
extern const struct pb_message connect_msg_list_resp;
extern const struct pb_message connect_msg_guide_req;
extern const struct pb_message connect_msg_pause_req;
extern const struct pb_message connect_msg_resume_req;
extern const struct pb_message connect_msg_task_resp; /* every {Task task = 1} response */

/* Every request message, NULL-terminated (for fuzzing and tests). */
extern const struct pb_message *const connect_request_msgs[];

#endif
