/**
 * Agent Ledger client for Node 20+ (fetch, ESM, zero runtime dependencies).
 *
 * The rules every agent's HTTP client must get right, encoded once:
 * - a 202 is an answer (in progress / unknown), never an exception;
 * - timeouts, network errors, 429 and 5xx re-send the *same* request (the same operation ID)
 *   with exponential backoff and full jitter, honouring Retry-After;
 * - 422 is final (ParamsConflict with the differing fields); 400/401/403/404 throw at once.
 */
import { createHmac, timingSafeEqual } from "node:crypto";

export type Status = "prepared" | "in_flight" | "succeeded" | "failed" | "unknown";
export type Execution = "sync" | "async" | "client";
export type OutcomeStatus = "succeeded" | "failed" | "unknown";
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type Params = Record<string, Json>;

export interface Claim {
  fencing_token: number;
  lease_expires_at: string;
  idempotency_key: string;
}

/** The ledger's operation resource, plus how this answer arrived. */
export interface Operation {
  operation_id: string;
  tool: string;
  tool_version?: number | null;
  status: Status;
  customer_status?: string;
  guidance: string;
  params_hash?: string;
  attempts?: number;
  result?: Json;
  error_class?: string;
  provider_request_id?: string;
  run_id?: string;
  subject?: string;
  value?: { amount: number; currency: string } | null;
  reconciliation?: Record<string, Json> | null;
  status_url?: string;
  url?: string;
  claim?: Claim | null;
  created_at?: string;
  updated_at?: string;
  sent_at?: string | null;
  resolved_at?: string | null;
  /** 200 replay, 201 done, 202 not terminal yet. */
  httpStatus: number;
  replayed: boolean;
  retryAfter: number | null;
}

export interface RunPage {
  run_id: string;
  count: number;
  operations: Operation[];
  first_unresolved: Operation | null;
  next: string | null;
}

export interface Run {
  run_id: string;
  operations: Operation[];
  first_unresolved: Operation | null;
}

export interface ToolInfo {
  name: string;
  version: number;
  description: string;
  params_schema: Record<string, Json>;
  intent_fields: string[];
  free_text_fields: string[];
  secret_fields: string[];
  value: { amount_field: string; currency_field: string } | null;
  high_value_thresholds: Record<string, number>;
  four_eyes_thresholds: Record<string, number>;
  client_execution: boolean;
}

export interface Lease {
  operation_id: string;
  fencing_token: number;
  lease_expires_at: string;
}

export const TERMINAL: ReadonlySet<Status> = new Set(["succeeded", "failed"]);
export const isTerminal = (op: Pick<Operation, "status">): boolean => TERMINAL.has(op.status);

// --- errors -----------------------------------------------------------------------------

export class LedgerError extends Error {
  override name = "LedgerError";
}

/** An RFC 9457 problem answered by the ledger. */
export class ProblemError extends LedgerError {
  override name = "ProblemError";
  readonly code: string;
  readonly title: string;
  readonly detail: unknown;
  constructor(
    readonly status: number,
    readonly body: Record<string, unknown>,
    readonly operationId?: string,
  ) {
    const type = String(body["type"] ?? "");
    const code = String(body["code"] ?? (type.split("/").pop() || "error"));
    super(`${status} ${code}: ${String(body["title"] ?? body["detail"] ?? "")}`);
    this.code = code;
    this.title = String(body["title"] ?? "");
    this.detail = body["detail"];
  }
}
export class InvalidRequest extends ProblemError {
  override name = "InvalidRequest";
  get errors(): Record<string, unknown> {
    return (this.body["errors"] as Record<string, unknown>) ?? {};
  }
}
export class Unauthenticated extends ProblemError { override name = "Unauthenticated"; }
export class ToolNotAllowed extends ProblemError { override name = "ToolNotAllowed"; }
export class NotFound extends ProblemError { override name = "NotFound"; }
export class StaleFencingToken extends ProblemError { override name = "StaleFencingToken"; }
export class Throttled extends ProblemError { override name = "Throttled"; }
export class ServerError extends ProblemError { override name = "ServerError"; }
/** 422: the operation ID already names a different intent. Final: never retried. */
export class ParamsConflict extends ProblemError {
  override name = "ParamsConflict";
  get differences(): Record<string, { stored?: Json; submitted?: Json; detail?: string }> {
    return (this.body["differences"] as ParamsConflict["differences"]) ?? {};
  }
}
/** No answer after every retry: submit again with the SAME operation ID, never a new one. */
export class LedgerUnavailable extends LedgerError {
  override name = "LedgerUnavailable";
  constructor(message: string, readonly operationId?: string, override readonly cause?: unknown) {
    super(message);
  }
}
export class UnsafeOperationId extends LedgerError { override name = "UnsafeOperationId"; }
/** Throw inside `reserve()` when the provider definitively refused: reported as failed. */
export class ProviderRejected extends LedgerError {
  override name = "ProviderRejected";
  constructor(readonly errorClass = "provider_rejected") {
    super(errorClass);
  }
}
export class WebhookVerificationError extends LedgerError {
  override name = "WebhookVerificationError";
}

export function problemFor(status: number, body: unknown, operationId?: string): ProblemError {
  const b = (body && typeof body === "object" ? body : { detail: String(body) }) as Record<
    string,
    unknown
  >;
  const code = String(b["code"] ?? String(b["type"] ?? "").split("/").pop());
  if (status === 409 && code === "stale_fencing_token") return new StaleFencingToken(status, b, operationId);
  if (status >= 500) return new ServerError(status, b, operationId);
  const cls =
    ({ 400: InvalidRequest, 413: InvalidRequest, 401: Unauthenticated, 403: ToolNotAllowed,
      404: NotFound, 422: ParamsConflict, 429: Throttled } as Record<number, typeof ProblemError>)[
      status
    ] ?? ProblemError;
  return new cls(status, b, operationId);
}

// --- operation IDs ----------------------------------------------------------------------

const SEGMENT = /^[A-Za-z0-9._~-]+$/;
const TOOL_CALL =
  /^(call|fc|toolu|tool|tooluse|chatcmpl)[_-](?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{8,}$/i;
const UUID = /[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}/i;
const LONG_HEX = /[0-9a-f]{16,}/i;
const ULID = /^[0-9A-HJKMNP-TV-Z]{26}$/;

export function looksRandom(part: string): string | null {
  if (TOOL_CALL.test(part)) return "looks like a model's tool-call ID, which changes when the call is regenerated";
  if (UUID.test(part)) return "contains a UUID; a random ID made per attempt gives every retry a new identity";
  if (LONG_HEX.test(part)) return "contains a long random-looking hex string";
  if (ULID.test(part)) return "looks like a ULID generated per attempt";
  return null;
}

function part(name: string, value: string): string {
  if (!value || !SEGMENT.test(value)) {
    throw new UnsafeOperationId(`${name}=${JSON.stringify(value)}: use ASCII letters, digits and ._~- only`);
  }
  const reason = looksRandom(value);
  if (reason) throw new UnsafeOperationId(`${name}=${JSON.stringify(value)} ${reason}; build IDs from business keys`);
  return value;
}

/** `workflow:subject:action-sequence:vN` from business keys; refuses tool-call IDs and UUIDs. */
export function operationId(keys: {
  workflow: string;
  subject: string;
  action: string;
  /** Numbers repeated actions on the same object; required so two genuine actions never share an ID. */
  sequence: number;
  version?: number;
}): string {
  const { sequence, version = 1 } = keys;
  for (const [name, n] of [["sequence", sequence], ["version", version]] as const) {
    if (!Number.isInteger(n) || n < 1) throw new UnsafeOperationId(`${name} must be an integer starting at 1`);
  }
  const id = [part("workflow", keys.workflow), part("subject", keys.subject),
    `${part("action", keys.action)}-${sequence}`, `v${version}`].join(":");
  if (id.length > 200) throw new UnsafeOperationId("operation ID longer than 200 characters");
  return id;
}

// --- retries ----------------------------------------------------------------------------

export interface RetryPolicy {
  maxAttempts: number;
  baseDelayMs: number;
  maxDelayMs: number;
  maxRetryAfterMs: number;
}
export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 5, baseDelayMs: 250, maxDelayMs: 8000, maxRetryAfterMs: 60000 };
const RETRYABLE = new Set([429, 500, 502, 503, 504]);

export interface RetryEvent {
  method: string;
  path: string;
  attempt: number;
  reason: string; // "timeout", "network", or the HTTP status
  delayMs: number;
  operationId?: string;
}

/** Retry-After as milliseconds: delta-seconds or an HTTP date. */
export function parseRetryAfter(value: string | null, now = Date.now()): number | null {
  if (!value) return null;
  const seconds = Number(value.trim());
  if (value.trim() !== "" && Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, when - now);
}

export function retryDelayMs(policy: RetryPolicy, attempt: number, retryAfterMs: number | null,
  random: () => number = Math.random): number {
  if (retryAfterMs !== null) return Math.min(policy.maxRetryAfterMs, retryAfterMs) + random() * policy.baseDelayMs;
  return random() * Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (attempt - 1));
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

// --- the client -------------------------------------------------------------------------

export interface ClientOptions {
  timeoutMs?: number;
  retry?: Partial<RetryPolicy>;
  onRetry?: (event: RetryEvent) => void;
  fetch?: typeof fetch;
}

export interface SubmitOptions {
  operationId: string;
  runId?: string;
  toolCallId?: string;
  customerRef?: string;
  execution?: Execution;
}

const API = "/api/v1";
const MAX_SERVER_WAIT = 30;
const opPath = (id: string) => `${API}/operations/${encodeURIComponent(id).replaceAll("%3A", ":")}`;

export class LedgerClient {
  readonly baseUrl: string;
  private readonly retry: RetryPolicy;
  private readonly fetchImpl: typeof fetch;

  constructor(baseUrl: string, private readonly token: string, private readonly options: ClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.retry = { ...DEFAULT_RETRY, ...options.retry };
    this.fetchImpl = options.fetch ?? globalThis.fetch;
  }

  private async request(method: string, path: string, init: { body?: unknown; timeoutMs?: number;
    operationId?: string } = {}): Promise<Response> {
    const url = path.startsWith("http") ? path : `${this.baseUrl}${path}`;
    const body = init.body === undefined ? undefined : JSON.stringify(init.body);
    for (let attempt = 1; ; attempt++) {
      let outcome: Response | unknown;
      try {
        outcome = await this.fetchImpl(url, {
          method, body,
          headers: { Authorization: `Bearer ${this.token}`, Accept: "application/json",
            "User-Agent": "agent-ledger-client-ts/0.1",
            ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
          signal: AbortSignal.timeout(init.timeoutMs ?? this.options.timeoutMs ?? 30000),
        });
      } catch (error) {
        outcome = error;
      }
      let retryAfter: number | null = null;
      let reason: string;
      if (outcome instanceof Response) {
        if (!RETRYABLE.has(outcome.status)) return outcome;
        retryAfter = parseRetryAfter(outcome.headers.get("Retry-After"));
        reason = String(outcome.status);
        if (attempt >= this.retry.maxAttempts || (retryAfter ?? 0) > this.retry.maxRetryAfterMs) {
          throw problemFor(outcome.status, await readBody(outcome), init.operationId);
        }
      } else {
        const name = (outcome as Error)?.name;
        reason = name === "TimeoutError" || name === "AbortError" ? "timeout" : "network";
        if (attempt >= this.retry.maxAttempts) {
          const hint = init.operationId ? ` Submit again with the same operation ID (${init.operationId}), never a new one.` : "";
          throw new LedgerUnavailable(`No answer from the ledger: ${String(outcome)}.${hint}`, init.operationId, outcome);
        }
      }
      const delayMs = retryDelayMs(this.retry, attempt, retryAfter);
      this.options.onRetry?.({ method, path, attempt, reason, delayMs, operationId: init.operationId });
      await sleep(delayMs);
    }
  }

  private async operation(response: Response, operationId?: string): Promise<Operation> {
    const body = await readBody(response);
    if (![200, 201, 202].includes(response.status)) throw problemFor(response.status, body, operationId);
    return {
      ...(body as Omit<Operation, "httpStatus" | "replayed" | "retryAfter">),
      httpStatus: response.status,
      replayed: response.headers.get("Idempotent-Replayed")?.toLowerCase() === "true",
      retryAfter: parseRetryAfter(response.headers.get("Retry-After")),
    };
  }

  private async ok<T>(response: Response, operationId?: string): Promise<T> {
    const body = await readBody(response);
    if (response.status !== 200) throw problemFor(response.status, body, operationId);
    return body as T;
  }

  /** Record the intent and (execution "sync") have the ledger send it once. Never throws on 202. */
  async submit(tool: string, params: Params, options: SubmitOptions): Promise<Operation> {
    const body: Record<string, unknown> = { operation_id: options.operationId, tool, params };
    if (options.runId) body["run_id"] = options.runId;
    if (options.toolCallId) body["tool_call_id"] = options.toolCallId;
    if (options.customerRef) body["customer_ref"] = options.customerRef;
    if (options.execution && options.execution !== "sync") body["execution"] = options.execution;
    const response = await this.request("POST", `${API}/operations`, { body, operationId: options.operationId });
    return this.operation(response, options.operationId);
  }

  /** Read one operation; `wait` asks the ledger to hold the answer up to N seconds. */
  async get(operationId: string, options: { wait?: number } = {}): Promise<Operation> {
    const wait = options.wait ? Math.min(MAX_SERVER_WAIT, Math.floor(options.wait)) : 0;
    const path = wait ? `${opPath(operationId)}?wait=${wait}` : opPath(operationId);
    const response = await this.request("GET", path, {
      operationId, timeoutMs: (this.options.timeoutMs ?? 30000) + wait * 1000 });
    return this.operation(response, operationId);
  }

  /** Until succeeded or failed, or `timeoutMs` passes (then the latest answer is returned).
   * Long-polls where the ledger offers it, else polls at the pace of its Retry-After. */
  async wait(operationId: string, options: { timeoutMs?: number; pollIntervalMs?: number } = {}): Promise<Operation> {
    const deadline = Date.now() + (options.timeoutMs ?? 60000);
    for (;;) {
      const serverWait = Math.floor(Math.min(MAX_SERVER_WAIT, Math.max(0, (deadline - Date.now()) / 1000)));
      const started = Date.now();
      const op = await this.get(operationId, { wait: serverWait });
      if (isTerminal(op) || Date.now() >= deadline) return op;
      if (!serverWait || Date.now() - started < (serverWait * 1000) / 2) {
        const pause = options.pollIntervalMs ?? op.retryAfter ?? 1000;
        await sleep(Math.max(0, Math.min(pause, deadline - Date.now())));
      }
    }
  }

  async runPage(runId: string, options: { limit?: number; after?: string } = {}): Promise<RunPage> {
    const query = new URLSearchParams();
    if (options.limit !== undefined) query.set("limit", String(options.limit));
    if (options.after !== undefined) query.set("after", options.after);
    const qs = query.size ? `?${query}` : "";
    const page = await this.ok<RunPage>(await this.request("GET", `${API}/runs/${encodeURIComponent(runId)}/operations${qs}`));
    return { ...page, next: page.next ?? null };
  }

  /** Every operation of a run (following `next`) and the first one not yet resolved. */
  async run(runId: string, options: { pageSize?: number } = {}): Promise<Run> {
    let page = await this.runPage(runId, { limit: options.pageSize });
    const operations = [...page.operations];
    let firstUnresolved = page.first_unresolved;
    while (page.next) {
      page = await this.ok<RunPage>(await this.request("GET", page.next));
      operations.push(...page.operations);
      firstUnresolved ??= page.first_unresolved;
    }
    return { run_id: runId, operations, first_unresolved: firstUnresolved ?? null };
  }

  async tools(): Promise<ToolInfo[]> {
    return (await this.ok<{ tools: ToolInfo[] }>(await this.request("GET", `${API}/tools`))).tools;
  }

  async getTool(name: string): Promise<ToolInfo> {
    return this.ok<ToolInfo>(await this.request("GET", `${API}/tools/${encodeURIComponent(name)}`));
  }

  async heartbeat(operationId: string, fencingToken: number): Promise<Lease> {
    const response = await this.request("POST", `${opPath(operationId)}/heartbeat`, {
      body: { fencing_token: fencingToken }, operationId });
    return this.ok<Lease>(response, operationId);
  }

  async reportOutcome(operationId: string, fencingToken: number, status: OutcomeStatus,
    report: { result?: Params; providerReference?: string; errorClass?: string } = {}): Promise<Operation> {
    const response = await this.request("POST", `${opPath(operationId)}/outcome`, {
      operationId,
      body: { fencing_token: fencingToken, status, result: report.result ?? {},
        provider_reference: report.providerReference ?? "", error_class: report.errorClass ?? "" },
    });
    return this.operation(response, operationId);
  }

  /**
   * Client execution: `await client.reserve(tool, params, {operationId}, async (op) => {...})`.
   * The callback runs only when this caller wins the claim, with `op.idempotencyKey` to send to
   * the provider; heartbeats run meanwhile. Its return value is reported as `succeeded`; a throw
   * reports `unknown` (the call may have reached the provider) unless it is ProviderRejected or
   * matches `isRejection`, which report `failed`. Returns the final operation.
   */
  async reserve(tool: string, params: Params, options: Omit<SubmitOptions, "execution"> & {
    isRejection?: (error: unknown) => boolean; heartbeatIntervalMs?: number },
  body: (op: { idempotencyKey: string; fencingToken: number; operation: Operation }) => Promise<Params | void>,
  ): Promise<Operation> {
    const submitted = await this.submit(tool, params, { ...options, execution: "client" });
    const claim = submitted.claim;
    if (!claim) return submitted;
    const id = options.operationId;
    const interval = options.heartbeatIntervalMs ??
      Math.max(500, (Date.parse(claim.lease_expires_at) - Date.now()) / 3);
    const timer = setInterval(() => {
      this.heartbeat(id, claim.fencing_token).catch(() => undefined);
    }, interval);
    let outcome: [OutcomeStatus, Params | undefined, string];
    let failure: unknown;
    try {
      const result = await body({ idempotencyKey: claim.idempotency_key, fencingToken: claim.fencing_token, operation: submitted });
      outcome = ["succeeded", result ?? undefined, ""];
    } catch (error) {
      failure = error;
      const rejected = error instanceof ProviderRejected || (options.isRejection?.(error) ?? false);
      const errorClass = error instanceof ProviderRejected ? error.errorClass : ((error as Error)?.name ?? "Error");
      outcome = [rejected ? "failed" : "unknown", undefined, errorClass];
    } finally {
      clearInterval(timer);
    }
    const reported = await this.reportOutcome(id, claim.fencing_token, outcome[0], {
      result: outcome[1], errorClass: outcome[2] });
    if (failure !== undefined) throw failure;
    return reported;
  }

  /**
   * A guarded tool: `const refund = client.tool("refund")` is
   * `(params, {operationId, toolCallId?}) => Promise<Operation>`. Give `operationId` as a
   * function of the params to build it from business keys instead.
   */
  tool<P extends Params>(name: string, options: { operationId?: (params: P) => string;
    execution?: Exclude<Execution, "client">; runId?: string; waitMs?: number } = {}) {
    return async (params: P, call: { operationId?: string; toolCallId?: string } = {}): Promise<Operation> => {
      const id = call.operationId ?? options.operationId?.(params);
      if (!id) throw new TypeError(`${name}() needs an operationId`);
      const op = await this.submit(name, params, { operationId: id, toolCallId: call.toolCallId,
        runId: options.runId, execution: options.execution });
      return options.waitMs && !isTerminal(op) ? this.wait(id, { timeoutMs: options.waitMs }) : op;
    };
  }
}

async function readBody(response: Response): Promise<unknown> {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    return { detail: text.slice(0, 500) };
  }
}

/** A compact answer to hand back to an LLM as the tool result. */
export function forModel(op: Operation): Record<string, Json> {
  const answer: Record<string, Json> = { operation_id: op.operation_id, status: op.status, guidance: op.guidance };
  if (op.result !== undefined && op.result !== null) answer["result"] = op.result;
  if (op.error_class) answer["error_class"] = op.error_class;
  if (op.replayed) answer["replayed"] = true;
  if (!isTerminal(op)) answer["retry_with_same_operation_id_only"] = true;
  return answer;
}

// --- webhooks (Standard Webhooks) ---------------------------------------------------------

function secretBytes(secret: string): Buffer {
  return Buffer.from(secret.replace(/^whsec_/, ""), "base64");
}

export function signWebhook(body: string, secret: string, msgId: string, timestamp: number): string {
  const digest = createHmac("sha256", secretBytes(secret)).update(`${msgId}.${timestamp}.${body}`).digest("base64");
  return `v1,${digest}`;
}

/** Verify `webhook-id`/`webhook-timestamp`/`webhook-signature` and return the parsed event. */
export function verifyWebhook(body: string, headers: Record<string, string | undefined> | Headers,
  secret: string, options: { toleranceSeconds?: number; now?: number } = {}): Record<string, unknown> {
  const get = (name: string): string => {
    const value = headers instanceof Headers ? headers.get(name) :
      Object.entries(headers).find(([k]) => k.toLowerCase() === name)?.[1];
    if (!value) throw new WebhookVerificationError(`missing ${name} header`);
    return value;
  };
  const msgId = get("webhook-id");
  const timestamp = Number.parseInt(get("webhook-timestamp"), 10);
  if (!Number.isFinite(timestamp)) throw new WebhookVerificationError("webhook-timestamp is not an integer");
  const now = options.now ?? Date.now() / 1000;
  if (Math.abs(now - timestamp) > (options.toleranceSeconds ?? 300)) {
    throw new WebhookVerificationError("webhook-timestamp is outside the tolerance");
  }
  const expected = Buffer.from(signWebhook(body, secret, msgId, timestamp));
  const matched = get("webhook-signature").split(" ").some((candidate) => {
    const given = Buffer.from(candidate);
    return candidate.startsWith("v1,") && given.length === expected.length && timingSafeEqual(given, expected);
  });
  if (!matched) throw new WebhookVerificationError("no matching webhook signature");
  return JSON.parse(body) as Record<string, unknown>;
}
