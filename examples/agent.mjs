#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
// A minimal agent step: meter one LLM call with the Diverge SDK, act on the answer.
//
//   npm install --no-save ./sdk/node      (from the repository's top: only node_modules/)
//   DIVERGE_METER_URL=http://127.0.0.1:8080/api/v1/agenttask/meter \
//   DIVERGE_MACAROON_TOKEN="$(diverge task token my-task)" node examples/agent.mjs
//
// Arguments (all optional): MODEL TOKENS COST_USD. Exit 0 when metered or when the task
// is paused by its budget or iteration limit, 3 when the model is not allowed, 1 otherwise.
import { LLMMeterError, meterLLMUsage } from "@divergedev/sdk";

const [model = "claude-3-7-sonnet", tokens = "1500", cost = "0.0225"] = process.argv.slice(2);

try {
  const r = await meterLLMUsage({ model, tokensUsed: Number(tokens), costUSD: cost, iteration: 1 });
  console.log(`metered: ${r.totalTokensUsed} tokens, ${r.totalCostUSD} USD in total (iteration ${r.iteration})`);
  if (r.guidance) console.log(`guidance: ${r.guidance}`);
  if (r.previewUrl) console.log(`preview: ${r.previewUrl}`);
} catch (e) {
  if (e instanceof LLMMeterError && (e.isBudgetExceeded || e.isMaxIterationsExceeded)) {
    console.log(`${e.reason}: the task is paused; stopping (a reviewer can resume it)`);
    process.exit(0);
  }
  console.error(`metering failed: ${e.message}`);
  process.exit(e instanceof LLMMeterError && e.isModelDisallowed ? 3 : 1);
}
