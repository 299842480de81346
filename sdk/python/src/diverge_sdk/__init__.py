# SPDX-License-Identifier: Apache-2.0
"""Diverge SDK for agents: meter every LLM call against the task's budgets.

    from diverge_sdk import meter_llm_usage, LLMMeterError

    try:
        r = meter_llm_usage("claude-3-7-sonnet", tokens_used=1500, cost_usd="0.0225")
        if r.guidance:
            print("reviewer says:", r.guidance)
    except LLMMeterError as e:
        if e.is_budget_exceeded:
            ...  # the task is paused: stop cleanly

    complete_task("succeeded", "opened the fix as commit abc123")  # an external agent is done
"""
from .meter import (COMPLETE_PATH, DEFAULT_MAX_ATTEMPTS, DEFAULT_TOKEN_FILE, METER_PATH,
                    CompleteResult, LLMMeterError, MeterResult, TaskCompleteError,
                    complete_task, meter_llm_usage)

__all__ = ["meter_llm_usage", "MeterResult", "LLMMeterError", "METER_PATH",
           "complete_task", "CompleteResult", "TaskCompleteError", "COMPLETE_PATH",
           "DEFAULT_TOKEN_FILE", "DEFAULT_MAX_ATTEMPTS"]
__version__ = "0.1.0"
