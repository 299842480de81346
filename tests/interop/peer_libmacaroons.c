/* SPDX-License-Identifier: Apache-2.0 */
/* Interop peer over libmacaroons (Debian libmacaroons-dev 0.3.0), built and driven by
 * tests/integration/test_token_interop.py. libmacaroons 0.3.0 only speaks the V1 format,
 * so tokens in and out are V1 (base64); the driver transcodes V1 <-> V2 field by field.
 *   peer_libmacaroons mint KEYHEX IDENTIFIER [CAVEAT...]   -> V1 token
 *   peer_libmacaroons attenuate V1TOKEN CAVEAT...          -> V1 token
 *   peer_libmacaroons verify KEYHEX V1TOKEN                -> "ok", location, identifier,
 *                                                            one line per caveat; exit 1 on failure
 */
#include <macaroons.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int hex_key(unsigned char key[32], const char *hex)
{
    if (strlen(hex) != 64) {
        return -1;
    }
    for (int i = 0; i < 32; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            return -1;
        }
        key[i] = (unsigned char)v;
    }
    return 0;
}

static int print_token(const struct macaroon *m)
{
    enum macaroon_returncode e = MACAROON_SUCCESS;
    size_t n = macaroon_serialize_size_hint(m);
    char *buf = malloc(n);

    if (buf == NULL || macaroon_serialize(m, buf, n, &e) != 0) {
        printf("error: serialize %d\n", (int)e);
        free(buf);
        return 1;
    }
    printf("%s\n", buf);
    free(buf);
    return 0;
}

static struct macaroon *add_caveats(struct macaroon *m, int n, char **cavs)
{
    for (int i = 0; m != NULL && i < n; i++) {
        enum macaroon_returncode e = MACAROON_SUCCESS;
        struct macaroon *next =
            macaroon_add_first_party_caveat(m, (const unsigned char *)cavs[i], strlen(cavs[i]), &e);
        macaroon_destroy(m);
        m = next;
    }
    return m;
}

/* Records every first-party predicate and accepts it: only the signature is under test. */
static char seen[64][4096];
static int n_seen;

static int accept_all(void *f, const unsigned char *pred, size_t pred_sz)
{
    (void)f;
    if (n_seen < 64 && pred_sz < sizeof(seen[0])) {
        memcpy(seen[n_seen], pred, pred_sz);
        seen[n_seen][pred_sz] = '\0';
        n_seen++;
    }
    return 0;
}

static int verify(const char *hex, const char *token)
{
    enum macaroon_returncode e = MACAROON_SUCCESS;
    unsigned char key[32];
    struct macaroon *m = macaroon_deserialize(token, &e);
    struct macaroon_verifier *v = macaroon_verifier_create();
    const unsigned char *s;
    size_t n;
    int rc = 1;

    if (m == NULL) {
        printf("error: deserialize %d\n", (int)e);
        goto out;
    }
    if (hex_key(key, hex) != 0 || macaroon_verifier_satisfy_general(v, accept_all, NULL, &e) != 0) {
        printf("error: setup\n");
        goto out;
    }
    if (macaroon_verify(v, m, key, sizeof(key), NULL, 0, &e) != 0) {
        printf("error: verify %d\n", (int)e);
        goto out;
    }
    printf("ok\n");
    macaroon_location(m, &s, &n);
    printf("%.*s\n", (int)n, (const char *)s);
    macaroon_identifier(m, &s, &n);
    printf("%.*s\n", (int)n, (const char *)s);
    for (int i = 0; i < n_seen; i++) {
        printf("%s\n", seen[i]);
    }
    rc = 0;
out:
    macaroon_verifier_destroy(v);
    if (m != NULL) {
        macaroon_destroy(m);
    }
    return rc;
}

int main(int argc, char **argv)
{
    enum macaroon_returncode e = MACAROON_SUCCESS;
    unsigned char key[32];
    struct macaroon *m;
    int rc;

    if (argc >= 4 && strcmp(argv[1], "mint") == 0 && hex_key(key, argv[2]) == 0) {
        m = macaroon_create((const unsigned char *)"diverge", 7, key, sizeof(key),
                            (const unsigned char *)argv[3], strlen(argv[3]), &e);
        m = add_caveats(m, argc - 4, argv + 4);
    } else if (argc >= 4 && strcmp(argv[1], "attenuate") == 0) {
        m = add_caveats(macaroon_deserialize(argv[2], &e), argc - 3, argv + 3);
    } else if (argc == 4 && strcmp(argv[1], "verify") == 0) {
        return verify(argv[2], argv[3]);
    } else {
        fprintf(stderr, "usage: peer_libmacaroons mint|attenuate|verify ...\n");
        return 2;
    }
    if (m == NULL) {
        printf("error: %d\n", (int)e);
        return 1;
    }
    rc = print_token(m);
    macaroon_destroy(m);
    return rc;
}
