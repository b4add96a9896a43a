// The TypeScript client against a real stack (make test runs it: e2e
// TestTypeScriptClientAgainstARealStack starts the stack). Environment:
// SAS_API_URL and SAS_API_TOKEN (an operator token); SAS_TEST_SERVICE_ADDR,
// where this test serves the remote service the agents call (it answers
// build_export 202 Accepted, every other action at once).
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import { after, before, test } from "node:test";
import { Client, Problem } from "../src/index.js";

const apiURL = process.env.SAS_API_URL ?? "";
const sas = new Client(apiURL, process.env.SAS_API_TOKEN);
const tokens = new Map<string, (token: string) => void>(); // order id: who waits for its build_export's token
const early = new Map<string, string>();
let server: Server;

before(async () => {
  const [host, port] = (process.env.SAS_TEST_SERVICE_ADDR ?? "").split(":");
  server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      if (req.url?.endsWith("/build_export")) {
        const orderId = JSON.parse(body).order_id as string;
        const token = String(req.headers["sas-step-token"]);
        const wake = tokens.get(orderId);
        if (wake) wake(token);
        else early.set(orderId, token);
        res.writeHead(202).end();
        return;
      }
      res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ ok: true }));
    });
  });
  await new Promise<void>((resolve) => server.listen(Number(port), host, resolve));
});

after(() => new Promise<void>((resolve) => server.close(() => resolve())));

function tokenOf(orderId: string): Promise<string> {
  const got = early.get(orderId);
  if (got) return Promise.resolve(got);
  return new Promise((resolve) => tokens.set(orderId, resolve));
}

async function refused(p: Promise<unknown>): Promise<Problem> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof Problem, `not a Problem: ${e}`);
    return e;
  }
  assert.fail("not refused");
}

test("submit, submit again, await and search", async () => {
  const customer = "ts-" + crypto.randomUUID().slice(0, 8);
  const order = await sas.submit("shop", { customer, amount: 12 });
  assert.equal(order.outcome, "inserted");
  assert.equal((await sas.submit("shop", { customer, amount: 12 }, { orderId: order.order_id })).outcome, "duplicate");
  assert.equal((await refused(sas.submit("shop", { customer, amount: 13 }, { orderId: order.order_id }))).status, 409);
  const { event, ended } = await sas.awaitEnd(order.order_id, "30s");
  assert.ok(ended);
  assert.equal(event.status, "completed");
  assert.equal((await sas.get(order.order_id)).order.status, "completed");
  const page = await sas.list({ where: [`customer=${customer}`] });
  assert.deepEqual(page.orders.map((o) => o.order_id), [order.order_id]);
  const all: string[] = [];
  for await (const row of sas.orders({ workflow: "shop", limit: 1 })) all.push(row.order_id);
  assert.ok(all.includes(order.order_id));
});

test("follow each step to the wait, and signal it", async () => {
  const order = await sas.submit("approval", {}); // the wait begins a second later
  const seen: string[] = [];
  for await (const e of sas.follow(order.order_id, { steps: true })) {
    seen.push(e.kind + " " + (e.kind === "status" ? e.event.status : e.event.event));
    if (e.kind === "step" && e.event.event === "awaiting") {
      assert.equal(e.event.wait, "approved");
      const bad = await refused(sas.signal(order.order_id, "approved", { who: "nobody" }));
      assert.equal(bad.status, 422);
      assert.equal(bad.reason, "invalid_payload");
      const sent = await sas.signal(order.order_id, "approved", { by: "ann" }, "approve-once");
      assert.equal(sent.signal_id, "approve-once");
    }
  }
  assert.ok(seen.includes("step awaiting"), `seen ${seen}`);
  assert.equal(seen.at(-1), "status completed");
});

test("a service calls back with its step token", async () => {
  const order = await sas.submit("export", {});
  const token = await tokenOf(order.order_id);
  const callbacks = new Client(apiURL); // the step token is the credential
  const held = await callbacks.heartbeat(token);
  assert.equal(held.outcome, "applied");
  assert.ok(held.complete_by);
  const done = await callbacks.complete(token, { file: "s3://exports/1.csv" });
  assert.deepEqual([done.outcome, done.order_id, done.step], ["applied", order.order_id, 1]);
  const again = await refused(callbacks.complete(token, { file: "s3://exports/1.csv" }));
  assert.deepEqual([again.status, again.reason], [409, "duplicate"]);
  assert.equal((await refused(callbacks.fail(token, "too late"))).reason, "stale_token");
  const forged = await refused(callbacks.complete(token.slice(0, -2) + (token.endsWith("AA") ? "BB" : "AA"), {}));
  assert.deepEqual([forged.status, forged.reason], [403, "invalid_token"]);
  const { event, ended } = await sas.awaitEnd(order.order_id, "30s");
  assert.ok(ended);
  assert.equal(event.status, "completed");
  assert.deepEqual((event.results as Record<string, unknown>)["build_export"], { file: "s3://exports/1.csv" });
});

test("refusals are problems", async () => {
  assert.equal((await refused(sas.get(crypto.randomUUID()))).status, 404);
  assert.equal((await refused(new Client(apiURL).get(crypto.randomUUID()))).status, 401);
});
