// A client of the sas HTTP API. Its types are generated from
// docs/api.openapi.yaml (npm run generate writes src/api.d.ts), so the
// compiler holds this client to the API's own description.
import type { components } from "./api.js";

export type Schemas = components["schemas"];
export type Accepted = Schemas["Accepted"];
export type OrderView = Schemas["OrderView"];
export type OrderList = Schemas["OrderList"];
export type OrderRow = Schemas["OrderRow"];
export type StatusEvent = Schemas["StatusEvent"];
export type StepEvent = Schemas["StepEvent"];
export type SignalSent = Schemas["SignalSent"];
export type CallbackDone = Schemas["CallbackDone"];
export type Acted = Schemas["Acted"];
export type ProblemDocument = Schemas["Problem"];

/** An event of an order's stream: its status, or (steps: true) a step's move. */
export type OrderEvent = { kind: "status"; event: StatusEvent } | { kind: "step"; event: StepEvent };

/** A refusal of the API, as its problem document (RFC 9457) says it. */
export class Problem extends Error {
  readonly status: number;
  readonly doc: ProblemDocument;
  /** The word sas gives: invalid_payload, stale_token, duplicate, ... */
  readonly reason: string;
  readonly detail: string;
  readonly retryAfter?: number;

  constructor(status: number, doc: ProblemDocument) {
    super(`${status} ${doc.title ?? ""}: ${doc.detail ?? ""}`.trim());
    this.name = "Problem";
    this.status = status;
    this.doc = doc;
    this.reason = doc.reason ?? "";
    this.detail = doc.detail ?? "";
    this.retryAfter = doc.retry_after;
  }
}

export interface SubmitOptions {
  orderId?: string;
  priority?: number;
  replyTo?: string;
  startAt?: string;
  placedAt?: string;
}

export interface ListOptions {
  status?: string;
  workflow?: string;
  where?: string[];
  limit?: number;
  after?: string;
  from?: string;
  to?: string;
}

const stepTokenHeader = "Sas-Step-Token";

/** The API at url (http://host:8090; /api/v1 is added), with an API
 * token for everything but a step's callbacks. */
export class Client {
  readonly base: string;

  constructor(url: string, readonly token?: string) {
    const trimmed = url.replace(/\/+$/, "");
    this.base = trimmed.endsWith("/api/v1") ? trimmed : trimmed + "/api/v1";
  }

  private async request(method: string, path: string, init: { body?: unknown; raw?: string; headers?: Record<string, string>;
    query?: [string, string][]; signal?: AbortSignal } = {}): Promise<Response> {
    let url = this.base + path;
    if (init.query && init.query.length > 0) {
      url += "?" + new URLSearchParams(init.query).toString();
    }
    const headers: Record<string, string> = { ...(init.headers ?? {}) };
    if (this.token) headers["Authorization"] = "Bearer " + this.token;
    let body: string | undefined = init.raw;
    if (init.body !== undefined) body = JSON.stringify(init.body);
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const resp = await fetch(url, { method, headers, body, signal: init.signal, redirect: "manual" });
    if (resp.status >= 300) {
      const text = await resp.text();
      let doc: ProblemDocument;
      try {
        doc = JSON.parse(text) as ProblemDocument;
      } catch {
        doc = { type: "about:blank", title: resp.statusText, status: resp.status, detail: text.slice(0, 500) };
      }
      throw new Problem(resp.status, doc);
    }
    return resp;
  }

  private async json<T>(method: string, path: string, init: Parameters<Client["request"]>[2] = {}): Promise<T> {
    const resp = await this.request(method, path, init);
    return (await resp.json()) as T;
  }

  /** Submits an order of workflow with payload. The same orderId with the
   * same content again is the same order (outcome duplicate); with other
   * content, a Problem (409). */
  submit(workflow: string, payload: Record<string, unknown>, opts: SubmitOptions = {}): Promise<Accepted> {
    const order: Schemas["SubmitOrder"] = {
      schema_version: 2,
      order_id: opts.orderId ?? crypto.randomUUID(),
      workflow,
      payload,
      ...(opts.priority !== undefined ? { priority: opts.priority } : {}),
      ...(opts.replyTo !== undefined ? { reply_to: opts.replyTo } : {}),
      ...(opts.startAt !== undefined ? { start_at: opts.startAt } : {}),
      ...(opts.placedAt !== undefined ? { placed_at: opts.placedAt } : {}),
    };
    return this.json<Accepted>("POST", "/orders", { body: order });
  }

  /** The order, its steps, history, results and search attributes. */
  get(orderId: string): Promise<OrderView> {
    return this.json<OrderView>("GET", `/orders/${encodeURIComponent(orderId)}`);
  }

  /** Waits (long-polls) until the order ends, for at most timeout (30s,
   * 2m, ...): its status event, and whether it ended (false: ask again). */
  async awaitEnd(orderId: string, timeout = "30s"): Promise<{ event: StatusEvent; ended: boolean }> {
    const resp = await this.request("GET", `/orders/${encodeURIComponent(orderId)}/await`, { query: [["timeout", timeout]] });
    return { event: (await resp.json()) as StatusEvent, ended: resp.headers.get("Sas-Ended") === "true" };
  }

  /** The order's events as they come (Server-Sent Events): its status
   * events (the current one first) and, with steps, its steps' moves;
   * ends when the order ends or is held in error. */
  async *follow(orderId: string, opts: { steps?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<OrderEvent> {
    const resp = await this.request("GET", `/orders/${encodeURIComponent(orderId)}/events`,
      { query: opts.steps ? [["steps", "true"]] : [], signal: opts.signal });
    if (!resp.body) return;
    const decoder = new TextDecoder();
    let buffered = "";
    let kind = "message";
    let data: string[] = [];
    for await (const chunk of resp.body as unknown as AsyncIterable<Uint8Array>) {
      buffered += decoder.decode(chunk, { stream: true });
      let nl: number;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl).replace(/\r$/, "");
        buffered = buffered.slice(nl + 1);
        if (line === "") {
          if (data.length > 0) {
            const event = JSON.parse(data.join("\n"));
            if (kind === "step") yield { kind: "step", event: event as StepEvent };
            else yield { kind: "status", event: event as StatusEvent };
          }
          kind = "message";
          data = [];
        } else if (line.startsWith("event:")) {
          kind = line.slice("event:".length).trim();
        } else if (line.startsWith("data:")) {
          data.push(line.slice("data:".length).trimStart());
        }
      }
    }
  }

  /** Sends the signal name to the order's wait, its payload the wait's
   * result; the same idempotencyKey twice is applied once. */
  signal(orderId: string, name: string, payload?: unknown, idempotencyKey?: string): Promise<SignalSent> {
    return this.json<SignalSent>("POST", `/orders/${encodeURIComponent(orderId)}/signals/${encodeURIComponent(name)}`, {
      raw: payload === undefined ? undefined : JSON.stringify(payload),
      headers: idempotencyKey ? { "Idempotency-Key": idempotencyKey } : {},
    });
  }

  /** A page of orders, newest first; pass its next as after for the next
   * page. where takes conditions on search attributes (customer=acme). */
  list(opts: ListOptions = {}): Promise<OrderList> {
    const query: [string, string][] = [];
    for (const key of ["status", "workflow", "limit", "after", "from", "to"] as const) {
      const v = opts[key];
      if (v !== undefined) query.push([key, String(v)]);
    }
    for (const w of opts.where ?? []) query.push(["where", w]);
    return this.json<OrderList>("GET", "/orders", { query });
  }

  /** Every order the filters select, page after page. */
  async *orders(opts: Omit<ListOptions, "after"> = {}): AsyncGenerator<OrderRow> {
    let after: string | undefined;
    do {
      const page = await this.list({ ...opts, after });
      yield* page.orders;
      after = page.next;
    } while (after);
  }

  /** Puts an order held in error back to work (operator). */
  resubmit(orderId: string, step?: number): Promise<Acted> {
    return this.json<Acted>("POST", `/orders/${encodeURIComponent(orderId)}/resubmit`, step ? { body: { step } } : {});
  }

  /** Cancels an order that has not ended: what was done is undone (operator). */
  cancel(orderId: string): Promise<Acted> {
    return this.json<Acted>("POST", `/orders/${encodeURIComponent(orderId)}/cancel`);
  }

  /** Completes the step whose call carried stepToken (its Sas-Step-Token),
   * with result. A Problem says why when it changed nothing: reason
   * stale_token, duplicate or invalid_token. No API token is needed. */
  complete(stepToken: string, result?: Record<string, unknown>, idempotencyKey?: string): Promise<CallbackDone> {
    return this.callback("complete", stepToken, result, idempotencyKey);
  }

  /** Fails the step for good, saying why: the workflow's policy applies. */
  fail(stepToken: string, error: string, idempotencyKey?: string): Promise<CallbackDone> {
    return this.callback("fail", stepToken, { error }, idempotencyKey);
  }

  /** Holds the step open: its deadline (complete_by) moves out by its timeout. */
  heartbeat(stepToken: string): Promise<CallbackDone> {
    return this.callback("heartbeat", stepToken, undefined, undefined);
  }

  private callback(name: string, stepToken: string, body: unknown, idempotencyKey?: string): Promise<CallbackDone> {
    const headers: Record<string, string> = { [stepTokenHeader]: stepToken };
    if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
    return this.json<CallbackDone>("POST", `/steps/${name}`, { raw: body === undefined ? undefined : JSON.stringify(body), headers });
  }
}
