/* SPDX-License-Identifier: Apache-2.0 */
/* The flags of `diverge serve` (SPEC §2): one table of flag, environment variable, default
 * and help; flags win over the environment; --help prints the table. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "egress/egress.h"
#include "server/serve_int.h"

struct flag {
    const char *name; /* "--listen" */
    const char *env;  /* "DIVERGE_LISTEN" */
    const char *def;  /* default, NULL when none */
    size_t offset;    /* of the char * field in struct server_config */
    const char *help;
};

/* The repeatable flags: their values are comma-joined (the first one on the command line
 * replaces the environment's list). */
static bool repeatable(const char *name)
{
    return strcmp(name, "--sandbox-allow-host") == 0 || strcmp(name, "--llm-upstream") == 0 ||
           strcmp(name, "--llm-key-file") == 0;
}

#define CFG(field_) offsetof(struct server_config, field_)

static const struct flag g_flags[] = {
    {"--listen", "DIVERGE_LISTEN", "127.0.0.1:8080", CFG(listen),
     "address:port of the HTTP server"},
    {"--data-dir", "DIVERGE_DATA_DIR", "./var", CFG(data_dir),
     "SQLite database, generated secrets, workspaces and logs"},
    {"--public-url", "DIVERGE_PUBLIC_URL", NULL, CFG(public_url),
     "base URL that sandboxes and links use (default http://<listen>)"},
    {"--macaroon-root-key-file", "DIVERGE_MACAROON_ROOT_KEY_FILE", NULL, CFG(root_key_file),
     "64 hex chars; generated 0600 when absent (default <data-dir>/macaroon-root-key)"},
    {"--api-token-file", "DIVERGE_API_TOKEN_FILE", NULL, CFG(api_token_file),
     "admin bearer token; generated 0600 when absent (default <data-dir>/api-token)"},
    {"--store", "DIVERGE_STORE", "sqlite", CFG(store),
     "sqlite (embedded) or kubernetes (AgentTasks in the cluster; Lease leader election)"},
    {"--kubeconfig", "DIVERGE_KUBECONFIG", NULL, CFG(kubeconfig),
     "--store kubernetes and --sandbox-provider agent-sandbox: kubeconfig file (default "
     "$KUBECONFIG, else in-cluster, else "
     "~/.kube/config)"},
    {"--kube-namespace", "DIVERGE_KUBE_NAMESPACE", NULL, CFG(kube_namespace),
     "--store kubernetes: namespace of the Lease diverge-leader, the token index and the "
     "queue ConfigMaps (default: the in-cluster or kubeconfig namespace)"},
    {"--lease-name", "DIVERGE_LEASE_NAME", "diverge-leader", CFG(lease_name),
     "--store kubernetes: the Lease whose holder runs the controller and the SCM workers"},
    {"--leader-elect", "DIVERGE_LEADER_ELECT", "true", CFG(leader_elect),
     "--store kubernetes: true (take part in the Lease election) or false (never lead: "
     "only the API, webhooks and the meter, never the controller or the SCM workers)"},
    {"--log-format", "DIVERGE_LOG_FORMAT", NULL, CFG(log_format),
     "text or json (default text on a terminal, else json)"},
    {"--sandbox-provider", "DIVERGE_SANDBOX_PROVIDER", "local", CFG(sandbox_provider),
     "local, process, none (no sandbox: an external agent meters with the task token) or "
     "agent-sandbox"},
    {"--sandbox-warm-pool", "DIVERGE_SANDBOX_WARMPOOL", NULL, CFG(sandbox_warm_pool),
     "agent-sandbox: the SandboxWarmPool every task's SandboxClaim names"},
    {"--sandbox-user", "DIVERGE_SANDBOX_USER", NULL, CFG(sandbox_user),
     "host user local sandboxes run as (default diverge-sandbox as root, else your own)"},
    {"--sandbox-tools", "DIVERGE_SANDBOX_TOOLS", NULL, CFG(sandbox_tools),
     "local and process sandboxes: a host folder of agent tools (e.g. an npm --prefix with "
     "node and agent CLIs), bound read-only at the same path; its bin/ comes first on PATH"},
    {"--sandbox-memory", "DIVERGE_SANDBOX_MEMORY", "2G", CFG(sandbox_memory),
     "memory limit per sandbox (K, M, G suffixes; 0: none)"},
    {"--sandbox-pids", "DIVERGE_SANDBOX_PIDS", "512", CFG(sandbox_pids),
     "process limit per sandbox (0: none)"},
    {"--sandbox-cpus", "DIVERGE_SANDBOX_CPUS", "1", CFG(sandbox_cpus),
     "CPU limit per sandbox, e.g. 1 or 0.5 (0: none)"},
    {"--sandbox-warm-slots", "DIVERGE_SANDBOX_WARM_SLOTS", "2", CFG(sandbox_warm_slots),
     "local: sandboxes started ahead, at most one per repository a task recently started on "
     "(idle ones stop after 10 minutes); the next new task of that repository takes it "
     "instead of starting bubblewrap (0: none)"},
    {"--git-push-max", "DIVERGE_GIT_PUSH_MAX", "64M", CFG(git_push_max),
     "largest git push a sandbox pod may send over HTTP (K, M, G suffixes; spooled to disk)"},
    {"--sandbox-disk", "DIVERGE_SANDBOX_DISK", "2G", CFG(sandbox_disk),
     "disk space a task's files (workspace, staging repository, state) may take with the local "
     "and process providers; over it the task fails with DiskLimit (K, M, G suffixes; 0: none)"},
    {"--data-dir-reserve", "DIVERGE_DATA_DIR_RESERVE", "256M", CFG(data_dir_reserve),
     "free space kept for the database on the data dir's filesystem: below it no sandbox "
     "starts, the biggest running one is stopped and /readyz answers 503 (0: none)"},
    {"--max-push-bytes", "DIVERGE_MAX_PUSH_BYTES", "100M", CFG(max_push_bytes),
     "largest push (size of the new objects) the server sends to a repository; a bigger one "
     "fails the task with PushTooLarge (K, M, G suffixes; 0: none)"},
    {"--max-running-tasks", "DIVERGE_MAX_RUNNING_TASKS", NULL, CFG(max_running_tasks),
     "sandboxes (running or frozen) that may exist at once; more tasks wait Pending with reason "
     "Queued and a queue position, first come first served, round robin across namespaces "
     "(default: the number of CPUs; 0: no limit)"},
    {"--push-wip", "DIVERGE_PUSH_WIP", "true", CFG(push_wip),
     "push the last checkpoint of a run that ends without a passing verify to the repository "
     "as branch diverge/wip/<task> (true or false)"},
    {"--stall-after", "DIVERGE_STALL_AFTER", "10m", CFG(stall_after),
     "a running task with no meter call, no gateway call and no sandbox output for this long "
     "is shown as stalled (ms, s, m, h suffixes; plain numbers are seconds; 0: never)"},
    {"--no-progress-after", "DIVERGE_NO_PROGRESS_AFTER", "3", CFG(no_progress_after),
     "identical verify failures in a row that pause a task with reason NoProgress (0: never)"},
    {"--sandbox-network", "DIVERGE_SANDBOX_NETWORK", "none", CFG(sandbox_network),
     "none (loopback only) or proxy (egress only through the server's allowlisting proxy)"},
    {"--sandbox-allow-host", "DIVERGE_SANDBOX_ALLOW_HOSTS", NULL, CFG(sandbox_allow_hosts),
     "host, *.suffix or IP literal, optionally :port (default 443), that proxy mode lets "
     "sandboxes reach; repeatable (env: comma list)"},
    {"--preview-base-url", "DIVERGE_PREVIEW_BASE_URL", NULL, CFG(preview_base_url),
     "base URL of the preview router; no linked preview Environments without it"},
    {"--agent-cmd", "DIVERGE_AGENT_CMD", NULL, CFG(agent_cmd),
     "command the runner runs each iteration (DIVERGE_AGENT_CMD in the sandbox)"},
    {"--verify-cmd", "DIVERGE_VERIFY_CMD", NULL, CFG(verify_cmd),
     "command the runner verifies each iteration with (DIVERGE_VERIFY_CMD)"},
    {"--default-budget-usd", "DIVERGE_DEFAULT_BUDGET_USD", "5.00", CFG(default_budget_usd),
     "USD budget of tasks without spec.budgetUSD"},
    {"--default-budget-tokens", "DIVERGE_DEFAULT_BUDGET_TOKENS", "1000000",
     CFG(default_budget_tokens), "token budget of tasks without spec.budgetTokens"},
    {"--default-max-iterations", "DIVERGE_DEFAULT_MAX_ITERATIONS", "5", CFG(default_max_iterations),
     "maxIterations of tasks made from comments"},
    {"--tls-listen", "DIVERGE_TLS_LISTEN", NULL, CFG(tls_listen),
     "also serve every route over HTTPS on address:port (kubectl, admission webhooks)"},
    {"--tls-cert-file", "DIVERGE_TLS_CERT_FILE", NULL, CFG(tls_cert_file),
     "PEM certificate (chain) of --tls-listen (default: self-signed, generated once)"},
    {"--tls-key-file", "DIVERGE_TLS_KEY_FILE", NULL, CFG(tls_key_file),
     "PEM private key of --tls-cert-file"},
    {"--github-webhook-secret", "DIVERGE_GITHUB_WEBHOOK_SECRET", NULL, CFG(github_webhook_secret),
     "HMAC secret(s) of GitHub deliveries, comma-separated (default: <data-dir>/"
     "github-webhook-secret from /setup/github-app; none: deliveries get 503)"},
    {"--github-api-url", "DIVERGE_GITHUB_API_URL", "https://api.github.com", CFG(github_api_url),
     "GitHub REST base (Enterprise: https://HOST/api/v3)"},
    {"--github-app-id", "DIVERGE_GITHUB_APP_ID", NULL, CFG(github_app_id),
     "GitHub App id (with --github-app-key-file; default: <data-dir>/github-app-id from "
     "/setup/github-app); else DIVERGE_NOTIFIER_TOKEN or GITHUB_TOKEN"},
    {"--github-app-key-file", "DIVERGE_GITHUB_APP_KEY_FILE", NULL, CFG(github_app_key_file),
     "GitHub App private key (PEM; default: <data-dir>/github-app-key.pem from /setup/github-app)"},
    {"--bot-login", "DIVERGE_BOT_LOGIN", NULL, CFG(bot_login),
     "the bot's own login, whose comments are ignored (default: asked from the API)"},
    {"--namespace", "DIVERGE_NAMESPACE", NULL, CFG(namespace_),
     "namespace of tasks made from comments (default: the project path as a DNS label)"},
    {"--notifier-provider", "DIVERGE_NOTIFIER_PROVIDER", NULL, CFG(notifier_provider),
     "github, gitlab or none (default: every provider with credentials)"},
    {"--github-min-permission-fix", "DIVERGE_GITHUB_MIN_PERMISSION_FIX", "write",
     CFG(github_min_fix), "permission for fix, guide, pause, resume"},
    {"--github-min-permission-budget", "DIVERGE_GITHUB_MIN_PERMISSION_BUDGET", "maintain",
     CFG(github_min_budget), "permission for budget and resume with amounts"},
    {"--notifier-min-interval", "DIVERGE_NOTIFIER_MIN_INTERVAL", "10", CFG(notifier_min_interval),
     "seconds between two spend-only edits of a sticky comment"},
    {"--gitlab-webhook-token", "DIVERGE_GITLAB_WEBHOOK_TOKEN", NULL, CFG(gitlab_webhook_token),
     "expected X-Gitlab-Token(s), comma-separated; with no signing secret either: 503"},
    {"--gitlab-signing-secret", "DIVERGE_GITLAB_SIGNING_SECRET", NULL, CFG(gitlab_signing_secret),
     "Standard Webhooks secret(s) whsec_<base64>, comma-separated"},
    {"--gitlab-url", "DIVERGE_GITLAB_URL", "https://gitlab.com", CFG(gitlab_url),
     "GitLab base URL (API under /api/v4); token DIVERGE_GITLAB_TOKEN or GITLAB_TOKEN"},
    {"--gitlab-min-access-fix", "DIVERGE_GITLAB_MIN_ACCESS_FIX", "30", CFG(gitlab_min_fix),
     "GitLab access level for fix, guide, pause, resume (30 Developer)"},
    {"--llm-upstream", "DIVERGE_LLM_UPSTREAMS", NULL, CFG(llm_upstreams),
     "NAME=URL: base URL of the LLM gateway's upstream NAME (anthropic, openai, gemini; "
     "default the public APIs); repeatable (env: comma list)"},
    {"--llm-key-file", "DIVERGE_LLM_KEY_FILES", NULL, CFG(llm_key_files),
     "NAME=PATH: file (0600) holding upstream NAME's API key, instead of "
     "DIVERGE_<NAME>_API_KEY; repeatable (env: comma list)"},
    {"--llm-prices", "DIVERGE_LLM_PRICES", NULL, CFG(llm_prices),
     "YAML price table of the LLM gateway (default: the built-in table, see README)"},
    {"--gitlab-min-access-budget", "DIVERGE_GITLAB_MIN_ACCESS_BUDGET", "40", CFG(gitlab_min_budget),
     "GitLab access level for budget and resume with amounts (40)"},
};

static char **field(struct server_config *cfg, const struct flag *f)
{
    return (char **)(void *)((char *)cfg + f->offset);
}

static void usage(FILE *out)
{
    fprintf(out, "usage: diverge serve [flags]\n\nRuns the Diverge server (task API, metering, "
                 "webhooks) with the embedded SQLite store.\nEvery flag has an environment "
                 "variable; flags win.\n\nflags:\n");
    for (size_t i = 0; i < ARRAY_LEN(g_flags); i++) {
        fprintf(out, "  %-26s %s (env %s%s%s)\n", g_flags[i].name, g_flags[i].help, g_flags[i].env,
                g_flags[i].def != NULL ? ", default " : "",
                g_flags[i].def != NULL ? g_flags[i].def : "");
    }
}

void serve_config_cleanup(struct server_config *cfg)
{
    for (size_t i = 0; i < ARRAY_LEN(g_flags); i++) {
        char **p = field(cfg, &g_flags[i]);
        free(*p);
        *p = NULL;
    }
}

/* --sandbox-network and --sandbox-allow-host (and --leader-elect): 0, or 2 after saying
 * what is wrong. */
static int check_network(const struct server_config *cfg)
{
    struct egress_policy *p;
    struct err err = {0};
    int rc;

    if (strcmp(cfg->leader_elect, "true") != 0 && strcmp(cfg->leader_elect, "false") != 0) {
        fprintf(stderr, "diverge: serve: --leader-elect must be true or false\n");
        return 2;
    }
    if (strcmp(cfg->sandbox_network, "none") != 0 && strcmp(cfg->sandbox_network, "proxy") != 0) {
        fprintf(stderr, "diverge: serve: --sandbox-network must be none or proxy\n");
        return 2;
    }
    if (cfg->sandbox_allow_hosts == NULL) {
        return 0;
    }
    egress_policy_new(&p);
    rc = egress_policy_add_rules_csv(p, cfg->sandbox_allow_hosts, EGRESS_ORIGIN_SERVER, &err);
    egress_policy_free(p);
    if (rc != E_OK) {
        fprintf(stderr,
                "diverge: serve: --sandbox-allow-host / DIVERGE_SANDBOX_ALLOW_HOSTS: %s (a host, "
                "*.suffix or IP literal, [v6] with a port, optionally :port)\n",
                err.msg);
        return 2;
    }
    return 0;
}

/* True when A is B or lies inside it (both absolute, without dot segments). */
static bool inside(const char *a, const char *b)
{
    size_t n = strlen(b);

    return strncmp(a, b, n) == 0 && (a[n] == '\0' || a[n] == '/' || (n > 0 && b[n - 1] == '/'));
}

/* --sandbox-tools: an absolute path of a folder that neither holds nor lies inside the data
 * dir (the sandbox would see the root key); 0, or 2 after saying what is wrong. */
static int check_tools(struct server_config *cfg)
{
    struct stat st;
    char *real, *data;
    bool bad;

    if (cfg->sandbox_tools == NULL) {
        return 0;
    }
    if (cfg->sandbox_tools[0] != '/' || stat(cfg->sandbox_tools, &st) != 0 ||
        !S_ISDIR(st.st_mode) || (real = realpath(cfg->sandbox_tools, NULL)) == NULL) {
        fprintf(stderr,
                "diverge: serve: --sandbox-tools / DIVERGE_SANDBOX_TOOLS: %s is not the "
                "absolute path of a folder\n",
                cfg->sandbox_tools);
        return 2;
    }
    data = realpath(cfg->data_dir, NULL);
    bad = data != NULL && (inside(real, data) || inside(data, real));
    free(data);
    if (bad) {
        fprintf(stderr,
                "diverge: serve: --sandbox-tools / DIVERGE_SANDBOX_TOOLS: %s holds or "
                "lies inside the data dir\n",
                real);
        free(real);
        return 2;
    }
    free(cfg->sandbox_tools);
    cfg->sandbox_tools = real;
    return 0;
}

/* The flags' values that need more than a parse: 0, or 2 after saying what is wrong. */
static int check_values(struct server_config *cfg)
{
    int rc = check_network(cfg);

    return rc != 0 ? rc : check_tools(cfg);
}

/* Stores VAL into F's field: replaces it, or for a repeatable flag seen before on the
 * command line, appends it after a comma. */
static void set_value(struct server_config *cfg, const struct flag *f, const char *val, bool seen)
{
    char **p = field(cfg, f);
    char *v;

    if (seen && *p != NULL && repeatable(f->name)) {
        v = xasprintf("%s,%s", *p, val);
    } else {
        v = xstrdup(val);
    }
    free(*p);
    *p = v;
}

/* Returns 0, or 2 after printing a usage error, or -1 after printing help. */
int serve_parse_flags(struct server_config *cfg, int argc, char **argv)
{
    bool seen[ARRAY_LEN(g_flags)] = {false};

    for (size_t i = 0; i < ARRAY_LEN(g_flags); i++) {
        const char *v = getenv(g_flags[i].env);
        if (v == NULL || v[0] == '\0') {
            v = g_flags[i].def;
        }
        *field(cfg, &g_flags[i]) = v != NULL ? xstrdup(v) : NULL;
    }
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a], *eq = strchr(arg, '='), *val;
        size_t nlen = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        size_t i;

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        for (i = 0; i < ARRAY_LEN(g_flags); i++) {
            if (strlen(g_flags[i].name) == nlen && strncmp(g_flags[i].name, arg, nlen) == 0) {
                break;
            }
        }
        if (i == ARRAY_LEN(g_flags)) {
            fprintf(stderr, "diverge: serve: unknown flag %s (see diverge serve --help)\n", arg);
            return 2;
        }
        if (eq != NULL) {
            val = eq + 1;
        } else if (a + 1 < argc) {
            val = argv[++a];
        } else {
            fprintf(stderr, "diverge: serve: %s needs a value\n", g_flags[i].name);
            return 2;
        }
        set_value(cfg, &g_flags[i], val, seen[i]);
        seen[i] = true;
    }
    return check_values(cfg);
}
