/** The TypeScript SDK against a live ledger, on the endpoints every ledger has. */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  InvalidRequest, LedgerClient, LedgerUnavailable, NotFound, ParamsConflict, Throttled,
  ToolNotAllowed, Unauthenticated, UnsafeOperationId, forModel, operationId, parseRetryAfter,
  retryDelayMs, DEFAULT_RETRY, signWebhook, verifyWebhook, WebhookVerificationError,
  type RetryEvent,
} from "../src/index.js";
import { refundParams, startInstance, unique, type Instance } from "./live.js";

const FAST = { maxAttempts: 3, baseDelayMs: 10, maxDelayMs: 50 };

describe("against a live ledger", () => {
  let ledger: Instance;
  let client: LedgerClient;
  const retries: RetryEvent[] = [];
  before(async () => {
    ledger = await startInstance();
    client = new LedgerClient(ledger.url, ledger.tokens.main, { onRetry: (e) => retries.push(e) });
  });
  after(async () => ledger.stop());

  it("creates a fresh refund and answers a regenerated call as a replay with one effect", async () => {
    const id = operationId({ workflow: unique(), subject: "invoice-17", action: "refund", sequence: 1 });
    const first = await client.submit("refund", refundParams("invoice-17"), { operationId: id, toolCallId: "call_aB3dE5fG7h" });
    const again = await client.submit("refund", refundParams("invoice-17", { memo: "Parcel arrived broken" }),
      { operationId: id, toolCallId: "call_zY9xW8vU7t" });
    assert.equal(first.httpStatus, 201);
    assert.equal(first.status, "succeeded");
    assert.deepEqual([again.httpStatus, again.replayed], [200, true]);
    assert.deepEqual(again.result, first.result);
    assert.equal((await ledger.effectCounts())[id], 1);
  });

  it("returns a lost provider response as unknown (no throw); the retry sends nothing new; wait resolves", async () => {
    const id = operationId({ workflow: unique(), subject: "invoice-18", action: "refund", sequence: 1 });
    const params = refundParams("invoice-18", { memo: "sandbox:lose-response" });
    const first = await client.submit("refund", params, { operationId: id });
    assert.deepEqual([first.httpStatus, first.status], [202, "unknown"]);
    assert.match(first.guidance, /do not retry with a new operation ID/);
    await client.submit("refund", params, { operationId: id });
    const resolved = await client.wait(id, { timeoutMs: 120000 });
    assert.equal(resolved.status, "succeeded");
    assert.equal((await ledger.effectCounts())[id], 1);
  });

  it("retries a response lost on the way to the agent with the same request", async () => {
    const bodies: string[] = [];
    let lost = false;
    const events: RetryEvent[] = [];
    const losing: typeof fetch = async (input, init) => {
      if (init?.method === "POST") bodies.push(String(init.body));
      const response = await fetch(input, init);
      if (init?.method === "POST" && !lost) {
        lost = true;
        await response.text();
        throw new DOMException("response lost", "TimeoutError");
      }
      return response;
    };
    const flaky = new LedgerClient(ledger.url, ledger.tokens.main, { fetch: losing, retry: FAST, onRetry: (e) => events.push(e) });
    const id = operationId({ workflow: unique(), subject: "invoice-19", action: "refund", sequence: 1 });
    const op = await flaky.submit("refund", refundParams("invoice-19"), { operationId: id });
    assert.deepEqual([op.status, op.replayed], ["succeeded", true]);
    assert.equal(bodies.length, 2);
    assert.equal(bodies[0], bodies[1]);
    assert.deepEqual(events.map((e) => [e.reason, e.operationId]), [["timeout", id]]);
    assert.equal((await ledger.effectCounts())[id], 1);
  });

  it("retries a 503 honouring Retry-After", async () => {
    let calls = 0;
    const events: RetryEvent[] = [];
    const unavailableFirst: typeof fetch = async (input, init) =>
      ++calls === 1 ? new Response("restarting", { status: 503, headers: { "Retry-After": "0" } }) : fetch(input, init);
    const c = new LedgerClient(ledger.url, ledger.tokens.main, { fetch: unavailableFirst, retry: FAST, onRetry: (e) => events.push(e) });
    const id = operationId({ workflow: unique(), subject: "invoice-20", action: "refund", sequence: 1 });
    assert.equal((await c.submit("refund", refundParams("invoice-20"), { operationId: id })).status, "succeeded");
    assert.deepEqual(events.map((e) => e.reason), ["503"]);
    assert.ok(events[0]!.delayMs <= FAST.baseDelayMs);
  });

  it("raises ParamsConflict with the field differences on a changed intent, and never retries it", async () => {
    const id = operationId({ workflow: unique(), subject: "invoice-21", action: "refund", sequence: 1 });
    await client.submit("refund", refundParams("invoice-21"), { operationId: id });
    const before = retries.length;
    await assert.rejects(client.submit("refund", refundParams("invoice-21", { amount: 2600 }), { operationId: id }),
      (error: unknown) => {
        assert.ok(error instanceof ParamsConflict);
        assert.equal(error.status, 422);
        assert.deepEqual(error.differences, { amount: { stored: 2500, submitted: 2600 } });
        return true;
      });
    assert.equal(retries.length, before);
    assert.deepEqual((await client.get(id)).value, { amount: 2500, currency: "EUR" });
  });

  it("throws at once on 401 and 403, and records nothing", async () => {
    const events: RetryEvent[] = [];
    const id = operationId({ workflow: unique(), subject: "invoice-22", action: "refund", sequence: 1 });
    await assert.rejects(new LedgerClient(ledger.url, "al_bad", { onRetry: (e) => events.push(e) })
      .submit("refund", refundParams("invoice-22"), { operationId: id }), Unauthenticated);
    await assert.rejects(new LedgerClient(ledger.url, ledger.tokens.narrow, { onRetry: (e) => events.push(e) })
      .submit("refund", refundParams("invoice-22"), { operationId: id }), ToolNotAllowed);
    assert.deepEqual(events, []);
    await assert.rejects(client.get(id), NotFound);
  });

  it("throws InvalidRequest with field errors for a float amount", async () => {
    const id = operationId({ workflow: unique(), subject: "invoice-23", action: "refund", sequence: 1 });
    await assert.rejects(client.submit("refund", refundParams("invoice-23", { amount: 25.5 }), { operationId: id }),
      (error: unknown) => error instanceof InvalidRequest && "params.amount" in error.errors);
  });

  it("throws LedgerUnavailable naming the ID to resubmit when nothing answers", async () => {
    const id = operationId({ workflow: unique(), subject: "invoice-24", action: "refund", sequence: 1 });
    const events: RetryEvent[] = [];
    const dead = new LedgerClient("http://127.0.0.1:9", "t", { retry: FAST, onRetry: (e) => events.push(e) });
    await assert.rejects(dead.submit("refund", refundParams("invoice-24"), { operationId: id }),
      (error: unknown) => error instanceof LedgerUnavailable && error.operationId === id && error.message.includes(id));
    assert.deepEqual(events.map((e) => e.reason), ["network", "network"]);
  });

  it("waits for a worker to resolve an async submission", async () => {
    const id = operationId({ workflow: unique(), subject: "invoice-25", action: "refund", sequence: 1 });
    const queued = await client.submit("refund", refundParams("invoice-25"), { operationId: id, execution: "async" });
    assert.equal(queued.httpStatus, 202);
    assert.equal((await client.wait(id, { timeoutMs: 120000 })).status, "succeeded");
    assert.equal((await ledger.effectCounts())[id], 1);
  });

  it("lists a run with its first unresolved operation", async () => {
    const run = unique();
    const done = operationId({ workflow: run, subject: "invoice-26", action: "refund", sequence: 1 });
    const pending = operationId({ workflow: run, subject: "invoice-27", action: "refund", sequence: 2 });
    await client.submit("refund", refundParams("invoice-26"), { operationId: done, runId: run });
    await client.submit("refund", refundParams("invoice-27", { memo: "sandbox:rate-limit" }), { operationId: pending, runId: run });
    const listed = await client.run(run);
    assert.deepEqual(listed.operations.map((o) => o.operation_id), [done, pending]);
    assert.equal(listed.first_unresolved?.operation_id, pending);
  });

  it("guards a tool in a few lines and answers a regenerated call as a replay", async () => {
    const run = unique();
    const refund = client.tool<ReturnType<typeof refundParams>>("refund", {
      operationId: (p) => operationId({ workflow: run, subject: p.invoice, action: "refund", sequence: 1 }) });
    const first = await refund(refundParams("invoice-28"), { toolCallId: "call_aaaa1111" });
    const again = await refund(refundParams("invoice-28", { memo: "reworded" }), { toolCallId: "call_bbbb2222" });
    assert.equal(first.status, "succeeded");
    assert.equal(again.replayed, true);
    assert.equal(forModel(again)["replayed"], true);
    assert.equal((await ledger.effectCounts())[first.operation_id], 1);
  });
  it("lists the catalogue tools this agent may use", async () => {
    const names = (await client.tools()).map((t) => t.name);
    assert.ok(names.includes("refund") && names.includes("send_email"));
    const narrow = new LedgerClient(ledger.url, ledger.tokens.narrow);
    assert.deepEqual((await narrow.tools()).map((t) => t.name), ["send_email"]);
    await assert.rejects(narrow.getTool("refund"), NotFound);
  });

  it("runs the README's ten-line version", async () => {
    const token = ledger.tokens.main;
    const workflow = unique();
    // --- as in the README (workflow and URL aside) ---
    type Refund = { invoice: string; amount: number; currency: string; payee: string; memo?: string };
    const ledgerClient = new LedgerClient(ledger.url, token);
    const refund = ledgerClient.tool<Refund>("refund", {
      operationId: (p) => operationId({ workflow, subject: p.invoice, action: "refund", sequence: 1 }),
    });
    const op = await refund({ invoice: "invoice-17", amount: 2500, currency: "EUR", payee: "cus_123", memo: "Damaged parcel" });
    // ---
    assert.equal(op.status, "succeeded");
    assert.equal(forModel(op)["operation_id"], `${workflow}:invoice-17:refund-1:v1`);
  });
});

describe("a throttling ledger (LEDGER_AGENT_RATE=2/s)", () => {
  let ledger: Instance;
  before(async () => { ledger = await startInstance({ worker: false, env: { LEDGER_AGENT_RATE: "2/s" } }); });
  after(async () => ledger.stop());

  it("retries a 429 with the same operation ID after Retry-After and acts once", async () => {
    const plain = new LedgerClient(ledger.url, ledger.tokens.main, { retry: { maxAttempts: 1 } });
    for (let i = 0; i < 5; i++) {
      try { await plain.get("warm:up-1:v1"); } catch (error) { if (error instanceof Throttled) break; }
    }
    const events: RetryEvent[] = [];
    const client = new LedgerClient(ledger.url, ledger.tokens.main, { onRetry: (e) => events.push(e) });
    const id = operationId({ workflow: "throttled", subject: "invoice-50", action: "refund", sequence: 1 });
    const op = await client.submit("refund", refundParams("invoice-50"), { operationId: id });
    assert.equal(op.status, "succeeded");
    assert.ok(events.length >= 1);
    assert.ok(events.every((e) => e.reason === "429" && e.operationId === id && e.delayMs >= 500));
    assert.equal((await ledger.effectCounts())[id], 1);
  });
});

describe("helpers", () => {
  it("builds operation IDs from business keys and refuses tool-call IDs and UUIDs", () => {
    assert.equal(operationId({ workflow: "workflow-81", subject: "invoice-17", action: "refund", sequence: 2 }),
      "workflow-81:invoice-17:refund-2:v1");
    for (const bad of ["call_aB3dE5fG7hJ9", "toolu_01A09q90qw90lq917835", crypto.randomUUID(), "a3f9c2e1b7d44e0f9a8b"]) {
      assert.throws(() => operationId({ workflow: "wf", subject: bad, action: "refund", sequence: 1 }), UnsafeOperationId);
    }
    assert.throws(() => operationId({ workflow: "a:b", subject: "x", action: "refund", sequence: 1 }), UnsafeOperationId);
    assert.throws(() => operationId({ workflow: "wf", subject: "x", action: "refund", sequence: 0 }), UnsafeOperationId);
  });

  it("honours Retry-After over backoff and reads HTTP dates", () => {
    assert.equal(parseRetryAfter("7"), 7000);
    assert.equal(parseRetryAfter(new Date(Date.now() + 30000).toUTCString(), Date.now()) !== null, true);
    assert.ok(retryDelayMs(DEFAULT_RETRY, 1, 3000, () => 0.5) >= 3000);
    assert.ok(retryDelayMs(DEFAULT_RETRY, 3, null, () => 0.999) <= 1000);
  });

  it("verifies Standard Webhooks signatures and refuses tampering or stale timestamps", () => {
    const secret = `whsec_${Buffer.from("a-shared-webhook-secret-32-bytes").toString("base64")}`;
    const body = JSON.stringify({ type: "operation.succeeded", data: { operation_id: "wf:inv:refund-1:v1" } });
    const now = Math.floor(Date.now() / 1000);
    const headers = { "webhook-id": "msg_1", "webhook-timestamp": String(now), "webhook-signature": signWebhook(body, secret, "msg_1", now) };
    assert.equal(verifyWebhook(body, headers, secret)["type"], "operation.succeeded");
    assert.throws(() => verifyWebhook(body.replace("succeeded", "failed"), headers, secret), WebhookVerificationError);
    const old = now - 3600;
    assert.throws(() => verifyWebhook(body, { ...headers, "webhook-timestamp": String(old),
      "webhook-signature": signWebhook(body, secret, "msg_1", old) }, secret), WebhookVerificationError);
  });
});
