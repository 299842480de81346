#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A minimal agent step: meter one LLM call with the Diverge SDK, act on the answer.

    pip install ./sdk/python          # or PYTHONPATH=sdk/python/src
    DIVERGE_METER_URL=http://127.0.0.1:8080/api/v1/agenttask/meter \
    DIVERGE_MACAROON_TOKEN="$(diverge task token my-task)" python3 examples/agent.py

Arguments (all optional): MODEL TOKENS COST_USD. Exit 0 when metered or when the task
is paused by its budget or iteration limit, 3 when the model is not allowed, 1 otherwise.
"""
import sys

from diverge_sdk import LLMMeterError, meter_llm_usage


def main(argv):
    model = argv[1] if len(argv) > 1 else "claude-3-7-sonnet"
    tokens = int(argv[2]) if len(argv) > 2 else 1500
    cost = argv[3] if len(argv) > 3 else "0.0225"
    try:
        r = meter_llm_usage(model, tokens_used=tokens, cost_usd=cost, iteration=1)
    except LLMMeterError as e:
        if e.is_budget_exceeded or e.is_max_iterations_exceeded:
            print("%s: the task is paused; stopping (a reviewer can resume it)" % e.reason)
            return 0
        print("metering failed: %s" % e, file=sys.stderr)
        return 3 if e.is_model_disallowed else 1
    print("metered: %d tokens, %s USD in total (iteration %d)" %
          (r.total_tokens_used, r.total_cost_usd, r.iteration))
    if r.guidance:
        print("guidance: %s" % r.guidance)
    if r.preview_url:
        print("preview: %s" % r.preview_url)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
