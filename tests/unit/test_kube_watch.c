/* SPDX-License-Identifier: Apache-2.0 */
/* The watch-stream parser over hostile input: events split anywhere, bookmarks, 410 as its
 * own ending, other ERROR events as errors, and every malformed or oversized event refused
 * before the caller sees it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kube/kube_int.h"
#include "tests/t_check.h"

struct seen {
    int events;    /* non-bookmark events */
    int bookmarks; /* bookmarks */
    int stop_at;   /* return 1 at this many events (0: never) */
};

static int on_event(enum kube_event type, const json_t *obj, void *userdata)
{
    struct seen *s = userdata;

    (void)obj;
    if (type == KUBE_EVENT_BOOKMARK) {
        s->bookmarks++;
    } else {
        s->events++;
    }
    return s->stop_at != 0 && s->events >= s->stop_at;
}

#define EV(type_, rv_)                                                                             \
    "{\"type\":\"" type_ "\",\"object\":{\"metadata\":{\"name\":\"t\",\"resourceVersion\":\"" rv_  \
    "\"}}}"

static const char stream[] = EV("ADDED", "5") "\n" EV("MODIFIED", "6") "\r\n\n" EV(
    "BOOKMARK", "9") "\n" EV("DELETED", "10"); /* the last line without its newline */

TEST(events_split_anywhere_keep_the_resource_version)
{
    for (size_t piece = 1; piece <= sizeof(stream); piece += 7) {
        struct seen s = {0};
        enum kube_watch_end end;
        char rv[KUBE_RV_MAX] = "1";
        struct err err = {0};

        CHECK_OK(kube_watch_feed(&end, rv, stream, strlen(stream), piece, on_event, &s, &err));
        CHECK_EQ_INT(end, KUBE_WATCH_CLOSED);
        CHECK_EQ_INT(s.events, 3);
        CHECK_EQ_INT(s.bookmarks, 1);
        CHECK_EQ_STR(rv, "10");
    }
}

TEST(callback_stop)
{
    struct seen s = {.stop_at = 1};
    enum kube_watch_end end;
    char rv[KUBE_RV_MAX] = "";

    CHECK_OK(kube_watch_feed(&end, rv, stream, strlen(stream), 3, on_event, &s, NULL));
    CHECK_EQ_INT(end, KUBE_WATCH_STOPPED);
    CHECK_EQ_INT(s.events, 1);
    CHECK_EQ_STR(rv, "5");
}

TEST(expired_is_gone)
{
    const char *in = EV("ADDED", "5") "\n{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\","
                                      "\"code\":410,\"reason\":\"Expired\"}}\n" EV("ADDED", "7");
    struct seen s = {0};
    enum kube_watch_end end;
    char rv[KUBE_RV_MAX] = "";

    CHECK_OK(kube_watch_feed(&end, rv, in, strlen(in), 4096, on_event, &s, NULL));
    CHECK_EQ_INT(end, KUBE_WATCH_GONE);
    CHECK_EQ_INT(s.events, 1); /* nothing after the ERROR */
}

struct bad {
    const char *in;
    int code;
    const char *needle;
};

static const struct bad bads[] = {
    {"{\"type\":\"ADDED\"", E_FAIL, "malformed event"},
    {"[1,2]\n", E_FAIL, "malformed event"},
    {"{\"type\":\"ADDED\",\"type\":\"DELETED\",\"object\":{}}\n", E_FAIL, "malformed event"},
    {"{\"type\":\"ADDED\",\"object\":[]}\n", E_FAIL, "event without an object"},
    {"{\"type\":\"EXPLODED\",\"object\":{}}\n", E_FAIL, "unknown event type"},
    {"{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}}\n", E_FAIL, "without a resourceVersion"},
    {"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":\"1&watch=0\"}}}\n", E_FAIL,
     "without a resourceVersion"},
    {"{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":500,\"reason\":"
     "\"InternalError\",\"message\":\"etcd\\nbroke\"}}\n",
     E_AGAIN, "InternalError (500): etcd broke"},
    {"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":\"\xff\"}}}\n", E_FAIL,
     "malformed event"},
};

TEST(hostile_events_are_refused)
{
    for (size_t i = 0; i < ARRAY_LEN(bads); i++) {
        struct seen s = {0};
        enum kube_watch_end end;
        char rv[KUBE_RV_MAX] = "3";
        struct err err = {0};
        int rc = kube_watch_feed(&end, rv, bads[i].in, strlen(bads[i].in), 5, on_event, &s, &err);

        if (rc != bads[i].code || strstr(err.msg, bads[i].needle) == NULL) {
            t_fail(__FILE__, __LINE__, "case %zu: rc %d msg \"%s\"", i, rc, err.msg);
        }
        CHECK_EQ_INT(s.events, 0);
        CHECK_EQ_STR(rv, "3");
    }
}

TEST(event_over_the_cap)
{
    size_t n = KUBE_EVENT_MAX + 2;
    char *big = xmalloc(n);
    struct seen s = {0};
    enum kube_watch_end end;
    char rv[KUBE_RV_MAX] = "";
    struct err err = {0};

    memset(big, ' ', n);
    big[0] = '{';
    CHECK_EQ_INT(kube_watch_feed(&end, rv, big, n, 65536, on_event, &s, &err), E_TOOBIG);
    /* exactly at the cap is still parsed (and is not JSON here) */
    CHECK_EQ_INT(kube_watch_feed(&end, rv, big, KUBE_EVENT_MAX, 65536, on_event, &s, &err), E_FAIL);
    free(big);
}

T_MAIN
