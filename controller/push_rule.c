/* SPDX-License-Identifier: Apache-2.0 */
/* Which branch the server may push for a task (SPEC §9): a plain branch name, never the
 * base branch of the repository a pull request targets, and never spec.repository's
 * baseBranch unless the bot granted it (a PR head whose name equals the clone base).
 * Pure: the task document and the root key in, a reason out. */
#include <string.h>
#include <strings.h>

#include "controller/controller.h"

static const char *ann_get(const json_t *task, const char *key)
{
    const json_t *ann = json_object_get(json_object_get(task, "metadata"), "annotations");
    return json_string_value(json_object_get(ann, key));
}

/* The length of URL without a trailing "/" and ".git" (the same repository either way). */
static size_t repo_len(const char *url)
{
    size_t n = strlen(url);

    while (n > 0 && url[n - 1] == '/') {
        n--;
    }
    if (n >= 4 && strncasecmp(url + n - 4, ".git", 4) == 0) {
        n -= 4;
    }
    while (n > 0 && url[n - 1] == '/') {
        n--;
    }
    return n;
}

bool controller_same_repository(const char *a, const char *b)
{
    size_t na, nb;

    if (a == NULL || b == NULL) {
        return false;
    }
    na = repo_len(a);
    nb = repo_len(b);
    /* Case-insensitive: GitHub's and GitLab's paths are; elsewhere it only refuses more. */
    return na == nb && strncasecmp(a, b, na) == 0;
}

static bool plain_branch(const char *b)
{
    return b != NULL && b[0] != '\0' && b[0] != '-' && strstr(b, "..") == NULL &&
           strchr(b, ':') == NULL;
}

const char *controller_push_refusal(const json_t *task,
                                    const unsigned char root_key[TOKEN_ROOT_KEY_LEN])
{
    const json_t *md = json_object_get(task, "metadata");
    const json_t *repo = json_object_get(json_object_get(task, "spec"), "repository");
    const char *url = json_string_value(json_object_get(repo, "url"));
    const char *working = json_string_value(json_object_get(repo, "workingBranch"));
    const char *base = json_string_value(json_object_get(repo, "baseBranch"));
    struct token_push_target t = {
        .ns = json_string_value(json_object_get(md, "namespace")),
        .name = json_string_value(json_object_get(md, "name")),
        .url = url,
        .working = working,
        .pr_base_url = ann_get(task, TASK_ANN_PR_BASE_REPOSITORY),
        .pr_base_ref = ann_get(task, TASK_ANN_PR_BASE_BRANCH),
    };

    if (url == NULL) {
        return "the task has no repository";
    }
    if (!plain_branch(working)) {
        return "the working branch is not a plain branch name";
    }
    /* Whatever made the task and whatever it is granted: these annotations can only add
     * refusals. */
    if (t.pr_base_ref != NULL && strcmp(working, t.pr_base_ref) == 0 &&
        controller_same_repository(url, t.pr_base_url)) {
        return "the working branch is the base branch of the repository the pull request "
               "targets";
    }
    if (base != NULL && strcmp(working, base) == 0 &&
        !token_push_grant_ok(ann_get(task, TASK_ANN_PUSH_GRANT), root_key, &t)) {
        return "the working branch is the base branch";
    }
    return NULL;
}
