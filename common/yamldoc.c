/* SPDX-License-Identifier: Apache-2.0 */
/* libyaml behind common/yamldoc.h: the project's one YAML parser (agent.yaml, kubeconfig).
 * A node handed out is libyaml's own node, seen through the opaque struct yamldoc_node, so
 * reading a document copies nothing. */
#include "common/yamldoc.h"

#include <stdlib.h>
#include <string.h>

#include <yaml.h>

struct yamldoc_reader {
    yaml_parser_t parser;
};

struct yamldoc {
    yaml_document_t doc;
};

static const yaml_node_t *to_yaml(const struct yamldoc_node *n)
{
    return (const yaml_node_t *)(const void *)n;
}

static const struct yamldoc_node *of_yaml(const yaml_node_t *n)
{
    return (const struct yamldoc_node *)(const void *)n;
}

int yamldoc_reader_new(struct yamldoc_reader **out, const char *data, size_t len)
{
    struct yamldoc_reader *r = xcalloc(1, sizeof(*r));

    *out = NULL;
    if (!yaml_parser_initialize(&r->parser)) {
        free(r);
        return E_FAIL;
    }
    yaml_parser_set_input_string(&r->parser, (const unsigned char *)data, len);
    *out = r;
    return E_OK;
}

void yamldoc_reader_free(struct yamldoc_reader *r)
{
    if (r == NULL) {
        return;
    }
    yaml_parser_delete(&r->parser);
    free(r);
}

int yamldoc_next(struct yamldoc **out, struct yamldoc_reader *r, struct yamldoc_syntax *syn)
{
    struct yamldoc *d = xcalloc(1, sizeof(*d));
    const yaml_parser_t *p = &r->parser;

    *out = NULL;
    /* On failure libyaml has already released whatever it had loaded of the document. */
    if (!yaml_parser_load(&r->parser, &d->doc)) {
        free(d);
        if (syn != NULL) {
            syn->out_of_memory = p->error == YAML_MEMORY_ERROR;
            syn->line = p->problem_mark.line + 1;
            syn->problem = p->problem;
            syn->context = p->context;
        }
        return E_INVALID;
    }
    *out = d;
    return E_OK;
}

void yamldoc_free(struct yamldoc *d)
{
    if (d == NULL) {
        return;
    }
    yaml_document_delete(&d->doc);
    free(d);
}

/* As yaml_document_get_node, without needing a mutable document. */
static const yaml_node_t *node_at(const struct yamldoc *d, int index)
{
    const yaml_document_t *doc = &d->doc;

    if (index > 0 && doc->nodes.start + index <= doc->nodes.top) {
        return doc->nodes.start + index - 1;
    }
    return NULL;
}

const struct yamldoc_node *yamldoc_root(const struct yamldoc *d)
{
    return d->doc.nodes.top != d->doc.nodes.start ? of_yaml(d->doc.nodes.start) : NULL;
}

size_t yamldoc_line_of_doc(const struct yamldoc *d)
{
    return d->doc.start_mark.line + 1;
}

enum yamldoc_kind yamldoc_kind(const struct yamldoc_node *n)
{
    switch (to_yaml(n)->type) {
    case YAML_SEQUENCE_NODE:
        return YAMLDOC_SEQUENCE;
    case YAML_MAPPING_NODE:
        return YAMLDOC_MAPPING;
    default:
        return YAMLDOC_SCALAR;
    }
}

size_t yamldoc_line(const struct yamldoc_node *n)
{
    return to_yaml(n)->start_mark.line + 1;
}

const char *yamldoc_scalar(const struct yamldoc_node *n)
{
    const yaml_node_t *y = to_yaml(n);

    return y->type == YAML_SCALAR_NODE ? (const char *)y->data.scalar.value : NULL;
}

size_t yamldoc_scalar_len(const struct yamldoc_node *n)
{
    const yaml_node_t *y = to_yaml(n);

    return y->type == YAML_SCALAR_NODE ? y->data.scalar.length : 0;
}

bool yamldoc_plain(const struct yamldoc_node *n)
{
    const yaml_node_t *y = to_yaml(n);

    return y->type == YAML_SCALAR_NODE && y->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

size_t yamldoc_count(const struct yamldoc_node *n)
{
    const yaml_node_t *y = to_yaml(n);

    if (y->type == YAML_SEQUENCE_NODE) {
        return (size_t)(y->data.sequence.items.top - y->data.sequence.items.start);
    }
    if (y->type == YAML_MAPPING_NODE) {
        return (size_t)(y->data.mapping.pairs.top - y->data.mapping.pairs.start);
    }
    return 0;
}

const struct yamldoc_node *yamldoc_item(const struct yamldoc *d, const struct yamldoc_node *n,
                                        size_t i)
{
    const yaml_node_t *y = to_yaml(n);

    ASSERT(y->type == YAML_SEQUENCE_NODE && i < yamldoc_count(n));
    return of_yaml(node_at(d, y->data.sequence.items.start[i]));
}

void yamldoc_pair(const struct yamldoc_node **key_out, const struct yamldoc_node **value_out,
                  const struct yamldoc *d, const struct yamldoc_node *n, size_t i)
{
    const yaml_node_t *y = to_yaml(n);

    ASSERT(y->type == YAML_MAPPING_NODE && i < yamldoc_count(n));
    *key_out = of_yaml(node_at(d, y->data.mapping.pairs.start[i].key));
    *value_out = of_yaml(node_at(d, y->data.mapping.pairs.start[i].value));
}

const struct yamldoc_node *yamldoc_get(const struct yamldoc *d, const struct yamldoc_node *n,
                                       const char *key)
{
    size_t klen = strlen(key);

    if (n == NULL || to_yaml(n)->type != YAML_MAPPING_NODE) {
        return NULL;
    }
    for (size_t i = 0; i < yamldoc_count(n); i++) {
        const struct yamldoc_node *k, *v;
        yamldoc_pair(&k, &v, d, n, i);
        if (k != NULL && to_yaml(k)->type == YAML_SCALAR_NODE &&
            klen == to_yaml(k)->data.scalar.length &&
            memcmp(to_yaml(k)->data.scalar.value, key, klen) == 0) {
            return v;
        }
    }
    return NULL;
}
