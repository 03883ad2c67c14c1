/** Starts a real ledger through the shared helper clients/testing/live_instance.py (the same one
 * the Python suite uses) and stops it when its standard input closes. */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

export interface Instance {
  url: string;
  sandbox_url: string;
  tokens: { main: string; narrow: string };
  stop(): Promise<void>;
  effectCounts(): Promise<Record<string, number>>;
}

export async function startInstance(options: { worker?: boolean; env?: Record<string, string> } = {}): Promise<Instance> {
  const python = process.env["LEDGER_SERVICE_PYTHON"] ??
    (existsSync(resolve(root, ".venv/bin/python")) ? resolve(root, ".venv/bin/python") : "python3");
  const args = [resolve(root, "clients/testing/live_instance.py")];
  if (options.worker === false) args.push("--no-worker");
  for (const [k, v] of Object.entries(options.env ?? {})) args.push("--env", `${k}=${v}`);
  const child: ChildProcess = spawn(python, args, { stdio: ["pipe", "pipe", "inherit"] });
  const line = await new Promise<string>((ok, fail) => {
    const lines = createInterface({ input: child.stdout! });
    lines.once("line", ok);
    child.once("exit", (code) => fail(new Error(`live_instance.py exited with ${code}`)));
  });
  const described = JSON.parse(line) as Omit<Instance, "stop" | "effectCounts">;
  return {
    ...described,
    async stop() {
      const exited = new Promise((ok) => child.once("exit", ok));
      child.stdin!.end();
      await exited;
    },
    async effectCounts() {
      const response = await fetch(`${described.sandbox_url}/_sandbox/effects`);
      return ((await response.json()) as { counts: Record<string, number> }).counts;
    },
  };
}

let counter = 0;
export const unique = (): string => `ts${process.pid}-${++counter}`;

export const refundParams = (invoice: string, extra: Record<string, string | number> = {}) => ({
  invoice, amount: 2500, currency: "EUR", payee: "cus_123", memo: "Damaged parcel", ...extra,
});
