/* SPDX-License-Identifier: Apache-2.0 */
/* What the bot says about a project's SpendQuotas (SPEC §15): the used / quota lines of
 * `/diverge status`, the refusal of `/diverge fix` in a project whose quota is used up
 * (naming the quota and the day it resets), and the budget cap a quota sets. Quota and
 * namespace names are DNS labels (checked by the store); nothing here echoes user text. */
#include <stdio.h>
#include <string.h>

#include "bot/bot_apply.h"
#include "common/money.h"
#include "store/quota.h"

/* "2027-01-01": the day Q's period ends (the next UTC month's first day). */
static void reset_day(char out[16], const struct quota_view *v)
{
    char ts[CLOCK_RFC3339_MAX];

    clock_rfc3339(ts, clock_next_month(v->period_start_ms));
    snprintf(out, 16, "%.10s", ts);
}

/* One quota's "`team`: $0.90 / $1.00 · 40 / 100 tokens" part. */
static void used_part(struct buf *out, const struct quota_view *v)
{
    char used[MONEY_STR_MAX], limit[MONEY_STR_MAX];

    money_format(used, v->used_usd);
    money_format(limit, v->monthly_usd);
    buf_printf(out, "`%s`: $%s", v->name, used);
    if (v->has_usd) {
        buf_printf(out, " / $%s", limit);
    }
    buf_printf(out, " · %lld", (long long)v->used_tokens);
    if (v->has_tokens) {
        buf_printf(out, " / %lld", (long long)v->monthly_tokens);
    }
    buf_puts(out, " tokens");
    if (v->has_running) {
        buf_printf(out, " · at most %lld running tasks", (long long)v->max_running);
    }
}

void bot_quota_lines(struct buf *out, const json_t *quotas)
{
    const json_t *q;
    size_t i;

    json_array_foreach(quotas, i, q)
    {
        struct quota_view v;
        char day[16];
        quota_view_of(&v, q);
        reset_day(day, &v);
        buf_printf(out, "%sProject quota ", i == 0 ? "\n" : "");
        used_part(out, &v);
        buf_printf(out, " this month (namespace `%s`, resets %s UTC)\n", v.ns, day);
    }
}

char *bot_reply_quota_used_up(const char *author, const json_t *q)
{
    struct quota_view v;
    struct buf out;
    char day[16];

    quota_view_of(&v, q);
    reset_day(day, &v);
    buf_init(&out, 0);
    buf_printf(&out, "@%s `/diverge fix` refused: this project's spend quota ", author);
    used_part(&out, &v);
    buf_printf(&out,
               " is used up for this month. It resets on %s (UTC); an operator can raise it "
               "before then (SpendQuota `%s` in namespace `%s`). Nothing was changed.\n",
               day, v.name, v.ns);
    return buf_take(&out);
}

/* Lowers *V (raised from OLD) to at most SPENT + LEFT, never below OLD; appends why. */
static bool cap_one(int64_t *v, int64_t old, int64_t spent, int64_t left, bool usd,
                    const char *quota, struct buf *note)
{
    int64_t cap = spent + (left > 0 ? left : 0);
    char amount[MONEY_STR_MAX];

    if (*v <= cap) {
        return false;
    }
    *v = cap > old ? cap : old;
    if (usd) {
        money_format(amount, *v);
    } else {
        snprintf(amount, sizeof(amount), "%lld", (long long)*v);
    }
    buf_printf(note,
               "The %s budget %s %s%s: the project's spend quota `%s` leaves no more this "
               "month.\n",
               usd ? "USD" : "token", *v > old ? "was raised only to" : "stays at", usd ? "$" : "",
               amount, quota);
    return true;
}

bool bot_quota_cap(int64_t *usd_io, int64_t old_usd, int64_t *tokens_io, int64_t old_tokens,
                   struct buf *note, const json_t *quotas, int64_t spent_usd, int64_t spent_tokens)
{
    struct quota_room room;
    bool capped = false;

    quota_room_of(&room, quotas);
    if (usd_io != NULL && room.has_usd) {
        capped = cap_one(usd_io, old_usd, spent_usd, room.usd_left, true, room.usd_name, note);
    }
    if (tokens_io != NULL && room.has_tokens) {
        capped = cap_one(tokens_io, old_tokens, spent_tokens, room.tokens_left, false,
                         room.tokens_name, note) ||
                 capped;
    }
    return capped;
}
