/* SPDX-License-Identifier: Apache-2.0 */
/* The read side of the SQLite backend (store_sqlite_read.c), inside store/ only. */
#ifndef DIVERGE_STORE_STORE_SQLITE_READ_H
#define DIVERGE_STORE_STORE_SQLITE_READ_H

#include "store/sqlite/store_sqlite_int.h"

/* Opens S's read connections to PATH (after the schema is in place); for ":memory:"
 * reads go to the writer's connection under s->mu instead. */
int sqlst_readers_open(struct sqlite_store *s, const char *path, struct err *err);
/* Whether reads share the writer's connection (":memory:", or a file not in WAL mode):
 * then no other connection may read the file while the writer writes. */
bool sqlst_readers_shared(const struct sqlite_store *s);
/* Closes them (before the writer's connection, so the writer checkpoints last). */
void sqlst_readers_close(struct sqlite_store *s);

/* The read ops of task_store_ops. */
int sqlst_get(json_t **out, struct task_store *st, const char *ns, const char *name,
              struct err *err);
int sqlst_list(json_t **items_out, int64_t *rv_out, struct task_store *st, const char *ns,
               struct err *err);
int sqlst_count_phases(int64_t counts_out[TASK_PHASE_COUNT], struct task_store *st,
                       struct err *err);
int sqlst_env_list(json_t **items_out, struct task_store *st, const char *ns, struct err *err);
int sqlst_env_get(json_t **out, struct task_store *st, const char *ns, const char *name,
                  struct err *err);

#endif
