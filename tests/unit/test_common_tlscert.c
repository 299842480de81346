/* SPDX-License-Identifier: Apache-2.0 */
/* The TLS listener's certificate (common/tlscert.c): generated once (0600 key) and reused,
 * a missing certificate remade for the kept key, a planted key refused, given files read
 * as they are, and base64. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/tlscert.h"
#include "tests/t_check.h"

static void paths(char key[128], char crt[128], const char *dir)
{
    snprintf(key, 128, "%s/%s", dir, TLSCERT_KEY_FILE);
    snprintf(crt, 128, "%s/%s", dir, TLSCERT_CERT_FILE);
}

TEST(generated_once_then_reused)
{
    char dir[] = "/tmp/test_tlscert.XXXXXX", key[128], crt[128];
    struct tlscert a = {0}, b = {0};
    bool created = false;
    struct err err = {0};
    struct stat st;

    ASSERT(mkdtemp(dir) != NULL);
    paths(key, crt, dir);
    CHECK_OK(tlscert_load_or_create(&a, &created, dir, &err));
    CHECK(created);
    CHECK(a.cert_pem != NULL && strncmp(a.cert_pem, "-----BEGIN CERTIFICATE-----", 27) == 0);
    CHECK(a.key_pem != NULL && strncmp(a.key_pem, "-----BEGIN PRIVATE KEY-----", 27) == 0);
    CHECK(stat(key, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK_OK(tlscert_load_or_create(&b, &created, dir, &err));
    CHECK(!created);
    CHECK_EQ_STR(a.cert_pem, b.cert_pem);
    CHECK_EQ_STR(a.key_pem, b.key_pem);
    tlscert_cleanup(&b);

    /* The certificate alone lost: remade for the same key. */
    CHECK(unlink(crt) == 0);
    CHECK_OK(tlscert_load_or_create(&b, &created, dir, &err));
    CHECK(created);
    CHECK_EQ_STR(a.key_pem, b.key_pem);
    CHECK(strcmp(a.cert_pem, b.cert_pem) != 0);
    tlscert_cleanup(&b);

    /* Given files are read as they are, through symbolic links too. */
    {
        char lnk[160];
        snprintf(lnk, sizeof(lnk), "%s/link.crt", dir);
        CHECK(symlink(crt, lnk) == 0);
        CHECK_OK(tlscert_load_files(&b, lnk, key, &err));
        CHECK(b.cert_pem != NULL && b.key_pem != NULL);
        tlscert_cleanup(&b);
        CHECK_EQ_INT(tlscert_load_files(&b, "/nonexistent/x.crt", key, &err), E_FAIL);
        CHECK_EQ_INT(tlscert_load_files(&b, crt, "/dev/null", &err), E_INVALID);
        CHECK(b.cert_pem == NULL && b.key_pem == NULL);
        unlink(lnk);
    }
    tlscert_cleanup(&a);
    unlink(key);
    unlink(crt);
    rmdir(dir);
}

TEST(planted_key_is_refused)
{
    char dir[] = "/tmp/test_tlscert.XXXXXX", key[128], crt[128], target[160];
    struct tlscert c = {0};
    struct err err = {0};
    FILE *f;

    ASSERT(mkdtemp(dir) != NULL);
    paths(key, crt, dir);
    snprintf(target, sizeof(target), "%s/elsewhere", dir);
    f = fopen(target, "w");
    ASSERT(f != NULL);
    fputs("-----BEGIN PRIVATE KEY-----\n", f);
    fclose(f);
    CHECK(chmod(target, 0600) == 0);
    CHECK(symlink(target, key) == 0);
    CHECK_EQ_INT(tlscert_load_or_create(&c, NULL, dir, &err), E_DENIED);
    CHECK(strstr(err.msg, "symbolic link") != NULL);
    CHECK(unlink(key) == 0);
    CHECK(rename(target, key) == 0 && chmod(key, 0644) == 0);
    CHECK_EQ_INT(tlscert_load_or_create(&c, NULL, dir, &err), E_DENIED);
    CHECK(strstr(err.msg, "chmod 600") != NULL);
    CHECK(c.cert_pem == NULL && c.key_pem == NULL);
    unlink(key);
    rmdir(dir);
}

TEST(base64_with_padding)
{
    char *s = tlscert_base64("", 0);
    CHECK_EQ_STR(s, "");
    free(s);
    s = tlscert_base64("f", 1);
    CHECK_EQ_STR(s, "Zg==");
    free(s);
    s = tlscert_base64("foobar", 6);
    CHECK_EQ_STR(s, "Zm9vYmFy");
    free(s);
}

T_MAIN
