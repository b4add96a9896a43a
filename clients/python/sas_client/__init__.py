"""A client of the sas HTTP API (docs/api.openapi.yaml), standard library only.

    from sas_client import Client, Problem

    sas = Client("http://localhost:8090", token="sas_...")
    order = sas.submit("order_approval", {"customer": "acme", "amount": 1200})
    for kind, event in sas.follow(order["order_id"], steps=True):
        if kind == "step" and event["event"] == "awaiting":
            sas.signal(order["order_id"], event["wait"], {"by": "ann"})
    event, ended = sas.await_end(order["order_id"], timeout="30s")

A service that answered a step's call 202 Accepted ends the step with the
token the call carried (Sas-Step-Token); no API token is needed for that:

    Client("http://localhost:8090").complete(token, {"file": "s3://..."})

Every refusal of the API raises Problem, which carries the problem
document (RFC 9457): its HTTP status, its type, the reason word sas gives
(invalid_payload, stale_token, duplicate, ...) and its detail.
"""

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid

__all__ = ["Client", "Problem"]
__version__ = "1.0.0"

STEP_TOKEN_HEADER = "Sas-Step-Token"


class Problem(Exception):
    """A refusal of the API, as its problem document says it."""

    def __init__(self, status, doc):
        self.status = status
        self.doc = doc if isinstance(doc, dict) else {"detail": str(doc)}
        self.type = self.doc.get("type", "")
        self.reason = self.doc.get("reason", "")
        self.detail = self.doc.get("detail", "")
        retry = self.doc.get("retry_after")
        self.retry_after = retry if isinstance(retry, int) else None
        super().__init__(f"{status} {self.doc.get('title', '')}: {self.detail or self.doc}".strip())


class Client:
    """The API at url (http://host:8090; /api/v1 is added), with an API
    token for everything but a step's callbacks."""

    def __init__(self, url, token=None, timeout=30.0):
        self.base = url.rstrip("/")
        if not self.base.endswith("/api/v1"):
            self.base += "/api/v1"
        self.token = token
        self.timeout = timeout

    # The requests.

    def _request(self, method, path, body=None, raw=None, headers=None, query=None, timeout=None, api_token=True):
        url = self.base + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if api_token and self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            with e:
                payload = e.read()
            try:
                doc = json.loads(payload)
            except ValueError:
                doc = {"detail": payload.decode("utf-8", "replace")[:500]}
            raise Problem(e.code, doc) from None

    def _json(self, method, path, **kw):
        with self._request(method, path, **kw) as resp:
            text = resp.read()
            return resp.status, resp.headers, (json.loads(text) if text else None)

    # Orders.

    def submit(self, workflow, payload, order_id=None, priority=None, reply_to=None, start_at=None, placed_at=None):
        """Submits an order of workflow with payload (a dict). The same
        order_id with the same content again is the same order (outcome
        duplicate); with other content, a Problem (409). Returns the
        answer: order_id, status, outcome (inserted or duplicate), href."""
        order = {"schema_version": 2, "order_id": order_id or str(uuid.uuid4()), "workflow": workflow, "payload": payload}
        for key, value in (("priority", priority), ("reply_to", reply_to), ("start_at", start_at), ("placed_at", placed_at)):
            if value is not None:
                order[key] = value
        return self._json("POST", "/orders", body=order)[2]

    def get(self, order_id):
        """The order, its steps, history, results and search attributes."""
        return self._json("GET", f"/orders/{_id(order_id)}")[2]

    def await_end(self, order_id, timeout="30s"):
        """Waits (long-polls) until the order ends, for at most timeout:
        returns its status event and whether it ended (False: it had not
        when the timeout passed; ask again)."""
        status, headers, event = self._json("GET", f"/orders/{_id(order_id)}/await", query={"timeout": timeout},
                                            timeout=self.timeout + _seconds(timeout))
        return event, headers.get("Sas-Ended") == "true"

    def follow(self, order_id, steps=False, timeout=None):
        """Yields the order's events as they come, as (kind, event): kind
        "status" with a status event (the current one first), and, with
        steps=True, kind "step" with a step event (claimed, awaiting a
        signal, processed, compensated, failed, ...). Ends when the order
        ends or is held in error."""
        query = {"steps": "true"} if steps else None
        resp = self._request("GET", f"/orders/{_id(order_id)}/events", query=query, timeout=timeout or 3600)
        with resp:
            kind, data = "message", []
            for line in resp:
                line = line.decode("utf-8").rstrip("\r\n")
                if line == "":
                    if data:
                        yield kind, json.loads("\n".join(data))
                    kind, data = "message", []
                elif line.startswith(":"):
                    continue
                elif line.startswith("event:"):
                    kind = line[len("event:"):].strip()
                elif line.startswith("data:"):
                    data.append(line[len("data:"):].lstrip())

    def signal(self, order_id, name, payload=None, idempotency_key=None):
        """Sends the signal name to the order's wait, its payload (any
        JSON value) the wait's result; the same idempotency_key twice is
        applied once. Refused at once, as a Problem, when no step of the
        order could take it."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        raw = None if payload is None else json.dumps(payload).encode()
        return self._json("POST", f"/orders/{_id(order_id)}/signals/{urllib.parse.quote(name, safe='')}", raw=raw,
                          headers=headers)[2]

    def list(self, status=None, workflow=None, where=(), limit=None, after=None, created_from=None, created_to=None):
        """A page of orders, newest first: {"orders": [...], "next": cursor}
        (pass next as after for the next page). where takes conditions on
        search attributes, as "customer=acme" or "amount>=100"."""
        query = [(k, v) for k, v in (("status", status), ("workflow", workflow), ("limit", limit), ("after", after),
                                      ("from", created_from), ("to", created_to)) if v is not None]
        query += [("where", w) for w in where]
        return self._json("GET", "/orders", query=query)[2]

    def orders(self, **filters):
        """Every order the filters of list select, page after page."""
        after = None
        while True:
            page = self.list(after=after, **filters)
            yield from page.get("orders", [])
            after = page.get("next")
            if not after:
                return

    # Operators.

    def resubmit(self, order_id, step=None):
        """Puts an order held in error back to work (operator)."""
        return self._json("POST", f"/orders/{_id(order_id)}/resubmit", body={"step": step} if step else None)[2]

    def cancel(self, order_id):
        """Cancels an order that has not ended: what was done is undone
        (operator)."""
        return self._json("POST", f"/orders/{_id(order_id)}/cancel")[2]

    # A step's callbacks: the step token is the credential.

    def complete(self, step_token, result=None, idempotency_key=None):
        """Completes the step whose call carried step_token, with result
        (a dict, or None). A Problem says why when it changed nothing:
        reason stale_token (the attempt no longer runs), duplicate (sent
        before), invalid_token."""
        return self._callback("complete", step_token, result, idempotency_key)

    def fail(self, step_token, error, idempotency_key=None):
        """Fails the step for good, saying why: the workflow's policy
        applies."""
        return self._callback("fail", step_token, {"error": error}, idempotency_key)

    def heartbeat(self, step_token):
        """Holds the step open: its deadline moves out by its timeout.
        Returns the answer, whose complete_by is the new deadline."""
        return self._callback("heartbeat", step_token, None, None)

    def _callback(self, name, step_token, body, idempotency_key):
        headers = {STEP_TOKEN_HEADER: step_token}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        raw = None if body is None else json.dumps(body).encode()
        # An API token goes along when the client has one (an API that
        # asks for both, SAS_API_CALLBACKS_NEED_TOKEN, needs it).
        return self._json("POST", f"/steps/{name}", raw=raw, headers=headers)[2]


def _id(order_id):
    return urllib.parse.quote(str(order_id), safe="")


def _seconds(duration):
    """The seconds of a Go duration such as 30s, 2m or 1m30s (0 if
    unreadable), to wait that much longer than the server does."""
    total, number = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1}
    text = str(duration)
    i = 0
    while i < len(text):
        c = text[i]
        if c.isdigit() or c == ".":
            number += c
        elif text.startswith("ms", i):
            total += float(number or 0) / 1000
            number = ""
            i += 1
        elif c in units:
            total += float(number or 0) * units[c]
            number = ""
        else:
            return 0.0
        i += 1
    return total
