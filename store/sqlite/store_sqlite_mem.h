/* SPDX-License-Identifier: Apache-2.0 */
/* The stored tasks in memory (store_sqlite_mem.c), inside store/sqlite/ only: GET and list
 * answered from a copy of every task's committed text. */
#ifndef DIVERGE_STORE_SQLITE_STORE_SQLITE_MEM_H
#define DIVERGE_STORE_SQLITE_STORE_SQLITE_MEM_H

#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "store/store.h"
#include "store/store_backend.h"

struct sqlst_mem;

/* Loads every task of DB (the writer's connection, at open, before any other thread) as
 * of resourceVersion RV. A copy over its limit comes back off, not as an error. */
int sqlst_mem_open(struct sqlst_mem **out, sqlite3 *db, int64_t rv, struct err *err);
void sqlst_mem_close(struct sqlst_mem *m);
/* Applies the N committed changes EV (in resourceVersion order; their json borrowed),
 * all under one hold of the lock: no read sees part of them. M may be NULL. */
void sqlst_mem_apply(struct sqlst_mem *m, const struct event *ev, size_t n);
/* Calls FN with the text of task NS/NAME: true with *rc_out = FN's return or
 * E_NOTFOUND; false (nothing called) when the copy is off or M is NULL. */
bool sqlst_mem_get(int *rc_out, struct sqlst_mem *m, const char *ns, const char *name,
                   task_text_fn fn, void *userdata);
/* Calls FN with the text of every task of NS (NULL: all), ordered by namespace and name,
 * and sets *rv_out (may be NULL) to the resourceVersion they are at: true with *rc_out
 * FN's first non-E_OK return, else E_OK; false when the copy is off or M is NULL. */
bool sqlst_mem_list(int *rc_out, int64_t *rv_out, struct sqlst_mem *m, const char *ns,
                    task_text_fn fn, void *userdata);
/* As sqlst_mem_list over every namespace, for the tasks whose phase is neither Completed
 * nor Failed only. */
bool sqlst_mem_list_live(int *rc_out, struct sqlst_mem *m, task_text_fn fn, void *userdata);
/* What the copy holds (tasks, bytes of text and keys) and whether it is on. */
void sqlst_mem_stats(struct sqlst_mem *m, size_t *count, size_t *bytes, bool *on);
/* Sets its limit (STORE_TASK_COPY_BYTES at open); a copy already past it goes off. */
void sqlst_mem_limit(struct sqlst_mem *m, size_t max_bytes);

#endif
