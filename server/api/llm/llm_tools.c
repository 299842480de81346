/* SPDX-License-Identifier: Apache-2.0 */
/* Tools the provider runs itself (web search, URL fetch, code execution, remote MCP
 * servers, file search, image generation) are taken out of a metered request before it is
 * forwarded. Two reasons: their cost is not bounded by the request (search results and
 * fetched pages are billed as input the body does not hold, so the call's reservation
 * could not cover it), and they reach the network from the provider's side, around the
 * sandbox's egress policy. Tools the agent runs itself (function declarations, custom
 * tools, the client-executed shell, editor and computer tools) stay, and so does a kind
 * not known here. */
#include <string.h>

#include "server/api/llm/llm_call.h"

/* The provider-run kinds, by prefix (versioned names: web_search_20250305, ...). A list of
 * what is known to reach out or run code rather than of what is allowed: the CLIs also
 * send provider-defined kinds that run nowhere but in the client or only search the
 * request's own tools (bash_*, text_editor_*, apply_patch, local_shell, tool_search), and
 * dropping those would break them. */
static const char *const g_anthropic_hosted[] = {"web_search", "web_fetch", "code_execution"};
static const char *const g_openai_hosted[] = {"web_search", "file_search", "code_interpreter",
                                              "image_generation", "mcp"};
/* The keys of a Gemini Tool object that run at Google (both spellings). */
static const char *const g_gemini_hosted[] = {
    "googleSearch", "google_search", "codeExecution", "code_execution", "urlContext",
    "url_context",  "googleMaps",    "google_maps",   "fileSearch",     "file_search"};

struct dropped {
    char *names; /* comma-separated kinds, printable ASCII, cut to fit */
    size_t cap;
    size_t count;
};

/* Records KIND (hostile: only [A-Za-z0-9_.-] kept, at most 40 bytes) as dropped. */
static void note(struct dropped *d, const char *kind)
{
    size_t len = strlen(d->names);

    d->count++;
    if (len > 0 && len + 1 < d->cap) {
        d->names[len++] = ',';
    }
    for (size_t i = 0; kind[i] != '\0' && i < 40 && len + 1 < d->cap; i++) {
        char ch = kind[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
        d->names[len++] = ok ? ch : '?';
    }
    d->names[len] = '\0';
}

static bool listed(const char *s, const char *const *list, size_t n)
{
    for (size_t i = 0; s != NULL && i < n; i++) {
        if (strncmp(s, list[i], strlen(list[i])) == 0) {
            return true;
        }
    }
    return false;
}

/* Whether tool T (an entry of "tools") is run by the provider; *KIND what to log. */
static bool hosted_tool(const json_t *t, enum llm_dialect dialect, const char **kind)
{
    const char *s = json_string_value(json_object_get(t, "type"));

    *kind = s;
    return dialect == LLM_DIALECT_ANTHROPIC
               ? listed(s, g_anthropic_hosted, ARRAY_LEN(g_anthropic_hosted))
               : listed(s, g_openai_hosted, ARRAY_LEN(g_openai_hosted));
}

/* Gemini: removes the provider-run keys of tool object T; true when T is then empty. */
static bool gemini_strip(json_t *t, struct dropped *d)
{
    const char *key;
    json_t *v, *tmp;
    bool any = false;

    json_object_foreach_safe(t, tmp, key, v)
    {
        if (listed(key, g_gemini_hosted, ARRAY_LEN(g_gemini_hosted))) {
            note(d, key);
            json_object_del(t, key);
            any = true;
        }
    }
    return any && json_object_size(t) == 0;
}

static void strip_tools(json_t *tools, enum llm_dialect dialect, struct dropped *d)
{
    size_t i = 0;

    while (i < json_array_size(tools)) {
        json_t *t = json_array_get(tools, i);
        const char *kind = NULL;
        bool drop;

        if (!json_is_object(t)) {
            i++; /* not a tool: the upstream refuses the request as it is */
            continue;
        }
        if (dialect == LLM_DIALECT_GEMINI) {
            drop = gemini_strip(t, d);
        } else {
            drop = hosted_tool(t, dialect, &kind);
            if (drop) {
                note(d, kind);
            }
        }
        if (drop) {
            json_array_remove(tools, i);
        } else {
            i++;
        }
    }
}

/* A top-level FIELD that makes the provider reach out (Anthropic mcp_servers, Chat
 * web_search_options) is removed. */
static void strip_field(json_t *body, const char *field, struct dropped *d)
{
    if (json_object_get(body, field) != NULL) {
        note(d, field);
        json_object_del(body, field);
    }
}

size_t llm_drop_hosted_tools(json_t *body, enum llm_dialect dialect, char *names, size_t cap)
{
    struct dropped d = {.names = names, .cap = cap, .count = 0};
    json_t *tools = json_object_get(body, "tools");

    names[0] = '\0';
    if (json_is_array(tools)) {
        strip_tools(tools, dialect, &d);
    }
    if (dialect == LLM_DIALECT_ANTHROPIC) {
        strip_field(body, "mcp_servers", &d);
    } else if (dialect == LLM_DIALECT_CHAT) {
        strip_field(body, "web_search_options", &d);
    }
    return d.count;
}
