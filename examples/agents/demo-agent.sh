#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# A demo agent for diverge-agent-runner: offline, no LLM. It "fixes" examples/demo-repo
# (greeting.txt) in the current directory (the runner starts it in the workspace):
# wrong on the first iteration, right once the runner says the last try failed
# (DIVERGE_LAST_FAILURE) or from the second iteration on (DIVERGE_ITERATION). Each run
# appends usage lines {"model":…,"tokensUsed":…,"costUSD":…} to $DIVERGE_USAGE_FILE as
# a real agent would after its LLM calls; the runner meters them.
#
# Knobs (all optional): DEMO_AGENT_MODEL (default demo-model), DEMO_AGENT_TOKENS
# (1200), DEMO_AGENT_COST (0.0180, dollars), DEMO_AGENT_CALLS (usage lines per run, 1).
set -eu

iter=${DIVERGE_ITERATION:-1}
model=${DEMO_AGENT_MODEL:-demo-model}
tokens=${DEMO_AGENT_TOKENS:-1200}
cost=${DEMO_AGENT_COST:-0.0180}
calls=${DEMO_AGENT_CALLS:-1}

case $model in
*[!A-Za-z0-9._:/*-]*) echo "demo-agent: DEMO_AGENT_MODEL has unexpected characters" >&2; exit 2 ;;
esac

if [ -n "${DIVERGE_GUIDANCE:-}" ]; then
    echo "demo-agent: guidance: $DIVERGE_GUIDANCE"
fi
if [ "$iter" -ge 2 ] || [ -n "${DIVERGE_LAST_FAILURE:-}" ]; then
    echo "demo-agent: iteration $iter: the last try failed; fixing the typo properly"
    printf 'Hello, world!\n' >greeting.txt
else
    echo "demo-agent: iteration $iter: first attempt"
    printf 'Hello, World!\n' >greeting.txt # wrong case: test.sh still fails
fi

if [ -n "${DIVERGE_USAGE_FILE:-}" ]; then
    n=0
    while [ "$n" -lt "$calls" ]; do
        printf '{"model":"%s","tokensUsed":%s,"costUSD":%s}\n' "$model" "$tokens" "$cost" \
            >>"$DIVERGE_USAGE_FILE"
        n=$((n + 1))
    done
fi
