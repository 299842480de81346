/* SPDX-License-Identifier: Apache-2.0 */
/* Whether a repository URL points into the server's data directory (mirrors of other
 * projects, staging repositories, workspaces): such a task would read what it must not.
 * The path is taken as git takes it from a file:// URL (any host ignored, percent-decoded),
 * then resolved: "." and "..", and symbolic links of the part that exists. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/secret.h"
#include "controller/controller.h"

#define DEMO_DIR "demo" /* `diverge local demo`'s example repository lives here */

/* S percent-decoded into a new string; NULL when it decodes to a NUL byte. */
static char *pct_decode(const char *s)
{
    char *out = xmalloc(strlen(s) + 1), *o = out;

    for (; *s != '\0'; s++) {
        int hi = s[0] == '%' ? secret_hex_digit(s[1]) : -1;
        int lo = hi >= 0 ? secret_hex_digit(s[2]) : -1;
        if (hi >= 0 && lo >= 0) {
            *o = (char)(hi * 16 + lo);
            s += 2;
        } else {
            *o = *s;
        }
        if (*o++ == '\0') {
            free(out);
            return NULL;
        }
    }
    *o = '\0';
    return out;
}

/* The absolute path P with "", "." and ".." segments resolved lexically (new string). */
static char *lexical(const char *p)
{
    char *out = xmalloc(strlen(p) + 2);
    size_t n = 0;

    while (*p != '\0') {
        size_t len = strcspn(p, "/");
        if (len == 2 && p[0] == '.' && p[1] == '.') {
            while (n > 0 && out[--n] != '/') {
            }
        } else if (len > 0 && !(len == 1 && p[0] == '.')) {
            out[n++] = '/';
            memcpy(out + n, p, len);
            n += len;
        }
        p += len + (p[len] == '/');
    }
    if (n == 0) {
        out[n++] = '/';
    }
    out[n] = '\0';
    return out;
}

/* The lexical path P with symbolic links resolved in its longest existing prefix (new
 * string). */
static char *resolved(const char *p)
{
    char *head = xstrdup(p), buf[PATH_MAX], *cut, *out;

    for (;;) {
        if (realpath(head[0] != '\0' ? head : "/", buf) != NULL) {
            out = xasprintf("%s%s", strcmp(buf, "/") == 0 ? "" : buf, p + strlen(head));
            break;
        }
        cut = strrchr(head, '/');
        if (cut == NULL) {
            out = xstrdup(p);
            break;
        }
        *cut = '\0';
    }
    free(head);
    return out;
}

/* Whether PATH is DIR or inside it. */
static bool inside(const char *path, const char *dir)
{
    size_t n = strlen(dir);

    while (n > 1 && dir[n - 1] == '/') {
        n--;
    }
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/' || n == 1);
}

/* Inside DIR but not inside DIR/demo. */
static bool in_data(const char *path, const char *dir)
{
    char *demo = xasprintf("%s/" DEMO_DIR, dir);
    bool in = inside(path, dir) && !inside(path, demo);

    free(demo);
    return in;
}

/* The data directory DATA_DIR as an absolute lexical path (new string, NULL when the
 * working directory is unknown). */
static char *absolute(const char *data_dir)
{
    char cwd[PATH_MAX], *joined, *out;

    if (data_dir[0] == '/') {
        return lexical(data_dir);
    }
    if (getcwd(cwd, sizeof(cwd)) == NULL) {
        return NULL;
    }
    joined = xasprintf("%s/%s", cwd, data_dir);
    out = lexical(joined);
    free(joined);
    return out;
}

bool controller_url_in_data_dir(const char *data_dir, const char *url)
{
    char real[PATH_MAX], *path, *lex, *res, *dabs;
    const char *p;
    bool in;

    if (url == NULL || strncasecmp(url, "file://", 7) != 0) {
        return false;
    }
    p = strchr(url + 7, '/'); /* git ignores the host of a file:// URL */
    if (p == NULL) {
        return false; /* no path: nothing git could open */
    }
    path = pct_decode(p);
    if (path == NULL) {
        return true; /* a NUL byte: refused whatever it names */
    }
    lex = lexical(path);
    res = resolved(lex);
    dabs = absolute(data_dir);
    /* Both spellings of both: a link into the data dir, or a data dir reached by a link. */
    in = (dabs != NULL && (in_data(lex, dabs) || in_data(res, dabs))) ||
         (realpath(data_dir, real) != NULL && (in_data(lex, real) || in_data(res, real)));
    free(path);
    free(lex);
    free(res);
    free(dabs);
    return in;
}
