/* SPDX-License-Identifier: Apache-2.0 */
/* Registry and runner for TEST()s. */
#include "tests/t_check.h"

#include <stdarg.h>
#include <stdio.h>

#define T_MAX 512

static struct {
    const char *name;
    t_fn fn;
} g_tests[T_MAX];
static int g_ntests;
static int g_failures;
static const char *g_current;

void t_register(const char *name, t_fn fn)
{
    if (g_ntests < T_MAX) {
        g_tests[g_ntests].name = name;
        g_tests[g_ntests].fn = fn;
        g_ntests++;
    }
}

void t_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "FAIL %s (%s:%d): ", g_current, file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    g_failures++;
}

static int selected(int argc, char **argv, const char *name)
{
    if (argc < 2) {
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], name) == 0) {
            return 1;
        }
    }
    return 0;
}

int t_main(int argc, char **argv)
{
    int ran = 0, failed_tests = 0;

    for (int i = 0; i < g_ntests; i++) {
        int before = g_failures;
        if (!selected(argc, argv, g_tests[i].name)) {
            continue;
        }
        g_current = g_tests[i].name;
        g_tests[i].fn();
        ran++;
        if (g_failures != before) {
            failed_tests++;
        }
    }
    printf("%d tests, %d failed, %d failed checks\n", ran, failed_tests, g_failures);
    return (g_failures == 0 && ran > 0) ? 0 : 1;
}
