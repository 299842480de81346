/* SPDX-License-Identifier: Apache-2.0 */
/* The linked preview Environment and the draft pull request of SPEC §4, as pure decisions
 * (which environment, which URL, which state after an action, where a draft PR goes) and
 * the documents they produce. The reconcile's applying transaction writes them, so the
 * Environment, the task's annotations and the queued PR change atomically with the phase. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/buf.h"
#include "controller/controller.h"

#define ANN_PREFIX "divergedev.com/"
#define TITLE_MAX 240 /* bytes of a draft PR title (GitHub allows 256 characters) */

static const char *annotation(const json_t *task, const char *key)
{
    const json_t *ann = json_object_get(json_object_get(task, "metadata"), "annotations");
    return json_string_value(json_object_get(ann, key));
}

static const char *spec_repo(const json_t *task, const char *key)
{
    const json_t *repo = json_object_get(json_object_get(task, "spec"), "repository");
    const char *v = json_string_value(json_object_get(repo, key));
    return v != NULL && v[0] != '\0' ? v : NULL;
}

char *controller_preview_env_name(const json_t *task, const char *base_url)
{
    const char *enabled = annotation(task, CONTROLLER_ANN_PREVIEW_ENABLED);
    const char *name =
        json_string_value(json_object_get(json_object_get(task, "metadata"), "name"));

    if (base_url == NULL || base_url[0] == '\0' || name == NULL || spec_repo(task, "url") == NULL ||
        (enabled != NULL && strcmp(enabled, "false") == 0)) {
        return NULL;
    }
    return xasprintf(CONTROLLER_PREVIEW_PREFIX "%s", name);
}

bool controller_preview_base_valid(const char *base_url)
{
    size_t scheme = strncasecmp(base_url, "https://", 8) == 0  ? 8
                    : strncasecmp(base_url, "http://", 7) == 0 ? 7
                                                               : 0;
    const char *host = base_url + scheme;

    if (scheme == 0 || host[0] == '\0' || host[0] == '/' || strpbrk(base_url, "?# ") != NULL) {
        return false;
    }
    for (const char *c = base_url; *c != '\0'; c++) {
        if ((unsigned char)*c < 0x21 || (unsigned char)*c > 0x7e) {
            return false;
        }
    }
    return true;
}

char *controller_preview_url(const char *base_url, const char *env)
{
    size_t n = strlen(base_url);

    while (n > 0 && base_url[n - 1] == '/') {
        n--;
    }
    return xasprintf("%.*s/?_diverge_env=%s", (int)n, base_url, env);
}

enum controller_env_state controller_preview_state(enum controller_action a, bool failed)
{
    if (failed) {
        return CONTROLLER_ENV_RELEASED;
    }
    switch (a) {
    case CONTROLLER_ACTIVATE:
    case CONTROLLER_PROVISION:
    case CONTROLLER_RESTART:
    case CONTROLLER_THAW:
    case CONTROLLER_RESUME_START:
        return CONTROLLER_ENV_RUNNING;
    case CONTROLLER_PAUSE:
        return CONTROLLER_ENV_HIBERNATED;
    case CONTROLLER_COMPLETE:
    case CONTROLLER_FAIL_RUNNER:
    case CONTROLLER_TIMEOUT:
    case CONTROLLER_FAIL_SANDBOX:
    case CONTROLLER_DISK_LIMIT:
        return CONTROLLER_ENV_RELEASED;
    case CONTROLLER_NOTHING:
    case CONTROLLER_REVOKE:
    case CONTROLLER_WAIT:
    case CONTROLLER_STOP:
    case CONTROLLER_RERUN:
    case CONTROLLER_PUSH_WIP:
    case CONTROLLER_ACTION_COUNT:
        break;
    }
    return CONTROLLER_ENV_KEEP;
}

static int64_t preview_port(const json_t *task)
{
    const char *p = annotation(task, ANN_PREFIX "preview-port");
    char *end = NULL;
    long v;

    if (p == NULL) {
        return 8080;
    }
    v = strtol(p, &end, 10);
    return end != p && *end == '\0' && v > 0 && v <= 65535 ? (int64_t)v : 8080;
}

static json_t *owner_ref(const json_t *task)
{
    const json_t *md = json_object_get(task, "metadata");
    const char *uid = json_string_value(json_object_get(md, "uid"));

    return json_pack("[{s:s, s:s, s:O, s:s, s:b, s:b}]", "apiVersion", TASK_API_VERSION, "kind",
                     TASK_KIND, "name", json_object_get(md, "name"), "uid", uid != NULL ? uid : "",
                     "controller", 1, "blockOwnerDeletion", 1);
}

json_t *controller_preview_env(const json_t *task, const json_t *old, const char *env,
                               const char *url, enum controller_env_state state,
                               const char *sandbox_ip)
{
    const json_t *md = json_object_get(task, "metadata");
    const char *service = annotation(task, ANN_PREFIX "preview-service");
    const char *image = annotation(task, ANN_PREFIX "preview-image");
    const char *branch = spec_repo(task, "workingBranch");
    const json_t *oann = json_object_get(json_object_get(old, "metadata"), "annotations");
    json_t *ann = json_is_object(oann) ? json_deep_copy(oann) : json_object();
    json_t *spec, *doc;
    const char *phase = "Running";

    json_object_del(ann, CONTROLLER_ANN_SANDBOX_IP);
    json_object_del(ann, CONTROLLER_ANN_HIBERNATED);
    if (state == CONTROLLER_ENV_RUNNING && sandbox_ip != NULL) {
        json_object_set_new(ann, CONTROLLER_ANN_SANDBOX_IP, json_string(sandbox_ip));
    } else if (state == CONTROLLER_ENV_HIBERNATED) {
        json_object_set_new(ann, CONTROLLER_ANN_HIBERNATED, json_string("true"));
        phase = "Hibernated";
    } else if (state == CONTROLLER_ENV_RELEASED) {
        phase = "Released";
    }
    spec = json_pack("{s:s, s:s, s:s, s:I}", "repository", spec_repo(task, "url"), "branch",
                     branch != NULL ? branch : "", "service",
                     service != NULL ? service : json_string_value(json_object_get(md, "name")),
                     "port", (json_int_t)preview_port(task));
    if (image != NULL) {
        json_object_set_new(spec, "image", json_string(image));
    }
    doc = json_pack("{s:s, s:s, s:{s:s, s:O, s:{s:O}, s:o, s:o}, s:o, s:{s:s, s:s}}", "apiVersion",
                    TASK_API_VERSION, "kind", TASK_ENV_KIND, "metadata", "name", env, "namespace",
                    json_object_get(md, "namespace"), "labels", ANN_PREFIX "agenttask",
                    json_object_get(md, "name"), "annotations", ann, "ownerReferences",
                    owner_ref(task), "spec", spec, "status", "phase", phase, "url", url);
    return doc;
}

char *controller_github_web_base(const char *api_url)
{
    size_t scheme;
    const char *h, *end;

    if (api_url == NULL) {
        return NULL;
    }
    scheme = strncasecmp(api_url, "https://", 8) == 0  ? 8
             : strncasecmp(api_url, "http://", 7) == 0 ? 7
                                                       : 0;
    if (scheme == 0) {
        return NULL;
    }
    h = api_url + scheme;
    end = h + strcspn(h, "/?#");
    if ((size_t)(end - h) == 14 && strncasecmp(h, "api.github.com", 14) == 0) {
        return xstrdup("https://github.com");
    }
    return end > h ? xstrndup(api_url, (size_t)(end - api_url)) : NULL;
}

static bool name_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

char *controller_github_project(const char *url, const char *web)
{
    size_t wn = strlen(web), slashes = 0;
    const char *p, *end;

    if (strncasecmp(url, web, wn) != 0 || url[wn] != '/') {
        return NULL;
    }
    p = url + wn + 1;
    end = p + strlen(p);
    if (end > p && end[-1] == '/') {
        end--;
    }
    if (end - p > 4 && strncmp(end - 4, ".git", 4) == 0) {
        end -= 4;
    }
    for (const char *c = p; c < end; c++) {
        if (*c == '/') {
            if (c == p || c + 1 == end || ++slashes > 1) {
                return NULL;
            }
        } else if (!name_char(*c)) {
            return NULL;
        }
    }
    return slashes == 1 ? xstrndup(p, (size_t)(end - p)) : NULL;
}

/* "local/<name>" of file:///…/<name>[.git][/]: the name with other characters as '-'. */
static char *local_project(const char *url)
{
    const char *p = url + 7, *base, *end = url + strlen(url);
    struct buf b;

    while (end > p && end[-1] == '/') {
        end--;
    }
    base = end;
    while (base > p && base[-1] != '/') {
        base--;
    }
    if (end - base > 4 && strncmp(end - 4, ".git", 4) == 0) {
        end -= 4;
    }
    if (end <= base) {
        return NULL;
    }
    buf_init(&b, 0);
    (void)buf_puts(&b, "local/");
    for (const char *c = base; c < end; c++) {
        char ch = name_char(*c) ? *c : '-';
        (void)buf_append(&b, &ch, 1);
    }
    return buf_take(&b);
}

bool controller_draft_pr_target(char **provider_out, char **project_out, const json_t *task,
                                const char *github_api_url)
{
    const char *url = spec_repo(task, "url");
    char *host;

    *provider_out = NULL;
    *project_out = NULL;
    if (!json_is_true(json_object_get(json_object_get(task, "spec"), "draftPR")) || url == NULL ||
        annotation(task, ANN_PREFIX "provider") != NULL) {
        return false; /* not asked, nothing pushed, or made from a PR comment (it has one) */
    }
    if (strncmp(url, "file://", 7) == 0) {
        *project_out = local_project(url);
        *provider_out = *project_out != NULL ? xstrdup("local") : NULL;
        return *project_out != NULL;
    }
    host = controller_github_web_base(github_api_url);
    if (host != NULL) {
        *project_out = controller_github_project(url, host);
        *provider_out = *project_out != NULL ? xstrdup("github") : NULL;
    }
    free(host);
    return *project_out != NULL;
}

/* The objective's first line, cut on a UTF-8 boundary to fit TITLE_MAX with the prefix. */
static char *pr_title(const char *task, const char *objective)
{
    size_t n = strcspn(objective, "\r\n"), room;
    char *prefix = xasprintf("fix(%s): ", task), *t;

    room = strlen(prefix) < TITLE_MAX ? TITLE_MAX - strlen(prefix) : 0;
    if (n > room) {
        n = room;
        while (n > 0 && ((unsigned char)objective[n] & 0xC0) == 0x80) {
            n--;
        }
    }
    t = xasprintf("%s%.*s", prefix, (int)n, objective);
    free(prefix);
    return t;
}

json_t *controller_draft_pr_request(const json_t *task)
{
    const json_t *md = json_object_get(task, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    const char *objective =
        json_string_value(json_object_get(json_object_get(task, "spec"), "objective"));
    const char *base = spec_repo(task, "baseBranch");
    const char *head = spec_repo(task, "workingBranch");
    char *title = pr_title(name, objective != NULL ? objective : "");
    char *body = xasprintf("Opened as a draft by Diverge when task `%s/%s` completed.\n\n"
                           "**Objective:** %s\n\n<!-- diverge-draft-pr: %s/%s -->",
                           ns, name, objective != NULL ? objective : "", ns, name);
    char *key = xasprintf("<!-- diverge-draft-pr: %s/%s -->", ns, name);
    json_t *req = json_pack("{s:s, s:s, s:s, s:s, s:b, s:s}", "title", title, "head",
                            head != NULL ? head : "", "base", base != NULL ? base : "main", "body",
                            body, "draft", 1, "key", key);

    free(key);
    free(title);
    free(body);
    return req;
}
