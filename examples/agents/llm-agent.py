#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An example of a real LLM agent for diverge-agent-runner (documented, not run in CI).

One run = one step: it shows an OpenAI-compatible chat model the objective, the last
failure and the repository's small text files, asks for a unified diff, appends the
call's usage to $DIVERGE_USAGE_FILE (the runner meters it: the budget applies) and
applies the diff with `git apply`. The runner repeats it until the verify command
passes. Python 3 stdlib only; the network goes through HTTPS_PROXY when the sandbox
runs with `--sandbox-network proxy` (allow the model API's host).

    DIVERGE_AGENT_CMD="python3 examples/agents/llm-agent.py"
    LLM_API_KEY=...  LLM_MODEL=gpt-4o-mini  LLM_BASE_URL=https://api.openai.com/v1
    LLM_PRICE_IN_PER_MTOK=0.15  LLM_PRICE_OUT_PER_MTOK=0.60   # dollars per 1M tokens

The task's spec.capabilities must allow LLM_MODEL, or the runner stops with exit 3.
"""
import decimal
import json
import os
import subprocess
import sys
import urllib.request

MAX_FILE = 20000      # bytes of one file shown to the model
MAX_CONTEXT = 120000  # bytes of all files shown
TIMEOUT = 120         # seconds for the model call


def repo_context():
    files = subprocess.run(["git", "ls-files", "-z"], capture_output=True,
                           check=True).stdout.split(b"\0")
    out, total = [], 0
    for name in files:
        if not name:
            continue
        try:
            with open(name, "rb") as f:
                data = f.read(MAX_FILE + 1)
        except OSError:
            continue
        if len(data) > MAX_FILE or b"\0" in data or total + len(data) > MAX_CONTEXT:
            continue
        total += len(data)
        out.append("=== %s ===\n%s" % (name.decode(errors="replace"),
                                         data.decode(errors="replace")))
    return "\n".join(out)


def ask(prompt):
    base = os.environ.get("LLM_BASE_URL", "https://api.openai.com/v1").rstrip("/")
    body = {"model": os.environ.get("LLM_MODEL", "gpt-4o-mini"),
            "messages": [{"role": "system", "content":
                          "You fix repositories. Answer with one unified diff (git apply "
                          "format, paths relative to the repository root) and nothing else."},
                         {"role": "user", "content": prompt}]}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + os.environ["LLM_API_KEY"]})
    with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
        return json.loads(resp.read())


def cost_of(usage):
    """Exact dollars (at most 6 decimals, rounded up) from the token counts and prices."""
    d = decimal.Decimal
    price_in = d(os.environ.get("LLM_PRICE_IN_PER_MTOK", "0"))
    price_out = d(os.environ.get("LLM_PRICE_OUT_PER_MTOK", "0"))
    cost = (d(usage.get("prompt_tokens", 0)) * price_in +
            d(usage.get("completion_tokens", 0)) * price_out) / d(1000000)
    return cost.quantize(d("0.000001"), rounding=decimal.ROUND_CEILING)


def record_usage(model, usage):
    path = os.environ.get("DIVERGE_USAGE_FILE")
    if not path:
        return
    line = {"model": model, "tokensUsed": int(usage.get("total_tokens", 0)),
            "costUSD": str(cost_of(usage))}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def strip_fences(text):
    lines = text.strip().splitlines()
    if lines and lines[0].startswith("```"):
        lines = lines[1:]
    if lines and lines[-1].startswith("```"):
        lines = lines[:-1]
    return "\n".join(lines) + "\n"


def main():
    prompt = "Objective: %s\n" % os.environ.get("DIVERGE_OBJECTIVE", "")
    if os.environ.get("DIVERGE_LAST_FAILURE"):
        prompt += "\nThe last attempt failed:\n%s\n" % os.environ["DIVERGE_LAST_FAILURE"]
    if os.environ.get("DIVERGE_GUIDANCE"):
        prompt += "\nGuidance from a reviewer: %s\n" % os.environ["DIVERGE_GUIDANCE"]
    if os.environ.get("DIVERGE_VERIFY_CMD"):
        prompt += "\nThe change must make this command pass: %s\n" % os.environ["DIVERGE_VERIFY_CMD"]
    prompt += "\nRepository files:\n" + repo_context()
    answer = ask(prompt)
    # Metered before anything else can fail: the call was made and costs money. The
    # model is reported as configured (the API may answer with a dated variant that the
    # task's capabilities do not list).
    record_usage(os.environ.get("LLM_MODEL", "gpt-4o-mini"), answer.get("usage") or {})
    diff = strip_fences(answer["choices"][0]["message"]["content"] or "")
    r = subprocess.run(["git", "apply", "--recount", "--whitespace=nowarn", "-"],
                       input=diff.encode(), capture_output=True)
    if r.returncode != 0:
        print("llm-agent: the model's diff did not apply: %s" %
              r.stderr.decode(errors="replace").strip()[:500])
        return 1
    print("llm-agent: applied the model's diff")
    return 0


if __name__ == "__main__":
    sys.exit(main())
