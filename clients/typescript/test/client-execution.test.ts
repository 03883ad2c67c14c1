/** Client execution (claim, heartbeat, outcome) against a live ledger. */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { LedgerClient, ProviderRejected, StaleFencingToken, operationId } from "../src/index.js";
import { refundParams, startInstance, unique, type Instance } from "./live.js";

describe("client execution", () => {
  let ledger: Instance;
  let client: LedgerClient;
  before(async () => {
    ledger = await startInstance();
    client = new LedgerClient(ledger.url, ledger.tokens.main);
  });
  after(async () => ledger.stop());

  it("reserves, runs the provider call with the key once, and reports success", async () => {
    const id = operationId({ workflow: unique(), subject: "invoice-60", action: "refund", sequence: 1 });
    const keys: string[] = [];
    const call = async (op: { idempotencyKey: string }) => {
      keys.push(op.idempotencyKey);
      const response = await fetch(`${ledger.sandbox_url}/v1/effects/refund`, {
        method: "POST", headers: { "Content-Type": "application/json", "Idempotency-Key": op.idempotencyKey },
        body: JSON.stringify({ reference: id, params: refundParams("invoice-60") }) });
      return (await response.json()) as Record<string, string>;
    };
    const done = await client.reserve("refund", refundParams("invoice-60"), { operationId: id }, call);
    const again = await client.reserve("refund", refundParams("invoice-60", { memo: "reworded" }), { operationId: id }, call);
    assert.equal(done.status, "succeeded");
    assert.equal(again.replayed, true);
    assert.equal(keys.length, 1);
    assert.equal((await ledger.effectCounts())[id], 1);
  });

  it("reports unknown when the call throws, failed when the provider rejected", async () => {
    const a = operationId({ workflow: unique(), subject: "invoice-61", action: "refund", sequence: 1 });
    await assert.rejects(client.reserve("refund", refundParams("invoice-61"), { operationId: a }, async () => {
      throw new Error("socket hang up"); }));
    assert.equal((await client.get(a)).status, "unknown");
    const b = operationId({ workflow: unique(), subject: "invoice-62", action: "refund", sequence: 1 });
    await assert.rejects(client.reserve("refund", refundParams("invoice-62"), { operationId: b }, async () => {
      throw new ProviderRejected("card_declined"); }), ProviderRejected);
    assert.equal((await client.get(b)).status, "failed");
  });

  it("refuses a stale fencing token", async () => {
    const id = operationId({ workflow: unique(), subject: "invoice-63", action: "refund", sequence: 1 });
    let token = 0;
    await client.reserve("refund", refundParams("invoice-63"), { operationId: id }, async (op) => {
      token = op.fencingToken; return { id: "done" }; });
    await assert.rejects(client.reportOutcome(id, token + 1, "succeeded"), StaleFencingToken);
  });

});
