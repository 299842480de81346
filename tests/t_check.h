/* SPDX-License-Identifier: Apache-2.0 */
/* The unit-test harness: TEST(name) registers a test; CHECK_* report both values on
 * failure and continue. A test binary given test names runs only those. */
#ifndef DIVERGE_TESTS_T_CHECK_H
#define DIVERGE_TESTS_T_CHECK_H

#include <stdint.h>
#include <string.h>

typedef void (*t_fn)(void);

void t_register(const char *name, t_fn fn);
void t_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int t_main(int argc, char **argv);

#define TEST(name_)                                                                                \
    static void test_##name_(void);                                                                \
    __attribute__((constructor)) static void reg_##name_(void)                                     \
    {                                                                                              \
        t_register(#name_, test_##name_);                                                          \
    }                                                                                              \
    static void test_##name_(void)

#define CHECK(c_)                                                                                  \
    do {                                                                                           \
        if (!(c_)) {                                                                               \
            t_fail(__FILE__, __LINE__, "CHECK(%s)", #c_);                                          \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a_, b_)                                                                       \
    do {                                                                                           \
        long long ta_ = (long long)(a_), tb_ = (long long)(b_);                                    \
        if (ta_ != tb_) {                                                                          \
            t_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a_, #b_, ta_, tb_);              \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_STR(a_, b_)                                                                       \
    do {                                                                                           \
        const char *ta_ = (a_), *tb_ = (b_);                                                       \
        if (ta_ == NULL || tb_ == NULL || strcmp(ta_, tb_) != 0) {                                 \
            t_fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a_, #b_,                     \
                   ta_ ? ta_ : "(null)", tb_ ? tb_ : "(null)");                                    \
        }                                                                                          \
    } while (0)

#define CHECK_OK(e_) CHECK_EQ_INT((e_), 0)

#define T_MAIN                                                                                     \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        return t_main(argc, argv);                                                                 \
    }

#endif
