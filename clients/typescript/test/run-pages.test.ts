/** NEEDS issue 11 on the server (paginated runs). Run with `npm run test:merged` after it is merged. */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { LedgerClient, operationId } from "../src/index.js";
import { refundParams, startInstance, unique, type Instance } from "./live.js";

describe("paginated runs", () => {
  let ledger: Instance;
  let client: LedgerClient;
  before(async () => {
    ledger = await startInstance({ worker: false });
    client = new LedgerClient(ledger.url, ledger.tokens.main);
  });
  after(async () => ledger.stop());

  it("follows every page of a run", async () => {
    const run = unique();
    for (let n = 1; n <= 5; n++) {
      await client.submit("refund", refundParams(`invoice-7${n}`), { runId: run,
        operationId: operationId({ workflow: run, subject: `invoice-7${n}`, action: "refund", sequence: n }) });
    }
    const first = await client.runPage(run, { limit: 2 });
    assert.equal(first.operations.length, 2);
    assert.ok(first.next);
    assert.equal((await client.run(run, { pageSize: 2 })).operations.length, 5);
  });
});
