// SPDX-License-Identifier: Apache-2.0
// Type declarations of @divergedev/sdk (index.mjs).

export declare const METER_PATH: "/api/v1/agenttask/meter";
export declare const COMPLETE_PATH: "/api/v1/agenttask/complete";
export declare const DEFAULT_TOKEN_FILE: "/etc/diverge/token/token";
export declare const DEFAULT_MAX_ATTEMPTS: number;

export interface MeterLLMUsageParams {
  /** The model called; required when the task restricts models (else HTTP 403). */
  model?: string | null;
  /** Tokens this call used (a delta, not a running total). */
  tokensUsed: number;
  /** USD this call cost: a number, or a decimal string such as "0.0225" sent exactly. */
  costUSD: number | string;
  /** Idempotency key; a random UUID when omitted, reused on every retry. */
  requestId?: string;
  /** The agent's iteration; the meter refuses iterations past spec.maxIterations. */
  iteration?: number | null;
  /** Tries in all (default DIVERGE_METER_MAX_ATTEMPTS or 5). */
  maxAttempts?: number;
  /** Limit for one try, in milliseconds (default 30000). */
  timeoutMs?: number;
  /** First retry delay in milliseconds, doubled each time (default 250, at most 10000). */
  backoffMs?: number;
}

export interface MeterResult {
  allowed: boolean;
  suspended: boolean;
  totalTokensUsed: number;
  /** Cumulative cost as the exact decimal text the server sent (e.g. "0.0675"): a string,
   * so no digit is lost to binary floating point. */
  totalCostUSD: string;
  iteration: number;
  maxIterations: number;
  /** Reviewer guidance for the agent, or null. */
  guidance: string | null;
  previewUrl: string | null;
  /** True when this requestId had been charged before (nothing was added). */
  duplicate: boolean;
  requestId: string;
}

export declare class LLMMeterError extends Error {
  /** HTTP status (400, 401, 403, 429, or the last 5xx); 0 when the meter was unreachable
   * or not configured. */
  readonly status: number;
  /** "budget exceeded", "max iterations exceeded", the server's reason word, or
   * "unreachable" / "not configured". */
  readonly reason: string;
  readonly body: Record<string, unknown> | null;
  readonly requestId: string | null;
  /** The totals a 429 carries, else null. */
  readonly result: MeterResult | null;
  get isBudgetExceeded(): boolean;
  get isMaxIterationsExceeded(): boolean;
  get isModelDisallowed(): boolean;
  get isUnauthenticated(): boolean;
}

export declare function meterLLMUsage(params: MeterLLMUsageParams): Promise<MeterResult>;

export interface CompleteTaskParams {
  /** "succeeded": the task becomes Completed; "failed": Failed (reason AgentReported). */
  result: "succeeded" | "failed";
  /** Shown as the task's status message (at most 4096 bytes, no control characters but
   * newline and tab). */
  message?: string | null;
  /** Tries in all (default DIVERGE_METER_MAX_ATTEMPTS or 5). */
  maxAttempts?: number;
  /** Limit for one try, in milliseconds (default 30000). */
  timeoutMs?: number;
  /** First retry delay in milliseconds, doubled each time (default 250, at most 10000). */
  backoffMs?: number;
}

export interface CompleteResult {
  /** "Completed" or "Failed". */
  phase: string;
  /** "AgentReported". */
  reason: string;
  message: string;
  /** True when this token had already ended the task the same way (a retry). */
  duplicate: boolean;
}

export declare class TaskCompleteError extends LLMMeterError {}

/** Ends the agent's own task with its token; the token is revoked. */
export declare function completeTask(params: CompleteTaskParams): Promise<CompleteResult>;
