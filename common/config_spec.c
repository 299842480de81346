/* SPDX-License-Identifier: Apache-2.0 */
/* What a loaded `.diverge/agent.yaml` puts into an AgentTask spec (SPEC §10): shared by
 * `diverge task create` and the bot's `/diverge fix`, so both read the file the same way. */
#include "common/config.h"

#include <jansson.h>

static json_t *string_list(char **items, size_t n)
{
    json_t *arr = json_array();

    for (size_t i = 0; i < n; i++) {
        json_array_append_new(arr, json_string(items[i]));
    }
    return arr;
}

/* SPEC[KEY], created as an empty object when absent or not an object (borrowed). */
static json_t *sub_object(json_t *spec, const char *key)
{
    json_t *o = json_object_get(spec, key);

    if (!json_is_object(o)) {
        o = json_object();
        json_object_set_new(spec, key, o);
    }
    return o;
}

static void set_str(json_t *obj, const char *key, const char *value)
{
    if (value != NULL) {
        json_object_set_new(obj, key, json_string(value));
    }
}

/* sandbox.provider, .timeoutSeconds, .network, .allowedHosts. */
static void apply_sandbox(json_t *spec, const struct config_agent *a)
{
    bool hosts = a->has_allowed_hosts && a->n_allowed_hosts > 0;
    json_t *sb;

    if (a->sandbox_provider == NULL && !a->has_sandbox_timeout && a->sandbox_network == NULL &&
        !hosts) {
        return;
    }
    sb = sub_object(spec, "sandbox");
    set_str(sb, "provider", a->sandbox_provider);
    if (a->has_sandbox_timeout) {
        json_object_set_new(sb, "timeoutSeconds", json_integer(a->sandbox_timeout_s));
    }
    set_str(sb, "network", a->sandbox_network);
    if (hosts) {
        json_object_set_new(sb, "allowedHosts", string_list(a->allowed_hosts, a->n_allowed_hosts));
    }
}

void config_agent_apply_spec(json_t *spec, const struct config_agent *a)
{
    if (a == NULL) {
        return;
    }
    if (a->has_capabilities && a->n_capabilities > 0) {
        json_object_set_new(spec, "capabilities", string_list(a->capabilities, a->n_capabilities));
    }
    if (a->has_allowed_tools && a->n_allowed_tools > 0) {
        json_object_set_new(spec, "allowedTools",
                            string_list(a->allowed_tools, a->n_allowed_tools));
    }
    apply_sandbox(spec, a);
    if (a->command != NULL || a->verify_command != NULL) {
        json_t *runner = sub_object(spec, "runner");
        set_str(runner, "command", a->command);
        set_str(runner, "verifyCommand", a->verify_command);
    }
}
