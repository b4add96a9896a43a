#!/usr/bin/env python3
"""Submit an order over the sas HTTP API, approve it, and wait for its end.

Standard library only. It submits an order of the demo's order_approval
workflow, waits (long-polls) until the order waits for its approval,
sends the signal `approved`, then awaits the order's end and finds the
customer's orders by their search attribute.

    SAS_API_URL=http://localhost:8090 SAS_API_TOKEN=sas_... python3 approve.py

(`make demo DEMO_FLAGS=--keep` runs the API and prints a token.) It exits
0 when the order completed, 1 otherwise, with the API's words.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

API = os.environ.get("SAS_API_URL", "http://localhost:8090").rstrip("/") + "/api/v1"
TOKEN = os.environ.get("SAS_API_TOKEN", "")


class Problem(Exception):
    """A refusal of the API: an RFC 9457 problem document."""

    def __init__(self, status, doc):
        self.status, self.doc = status, doc
        super().__init__(f"{status} {doc.get('title', '')}: {doc.get('detail', doc)}")


def call(method, path, body=None, timeout=90):
    """One request; the answer's status, headers and JSON body."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(API + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + TOKEN)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers, json.load(resp)
    except urllib.error.HTTPError as e:
        raise Problem(e.code, json.load(e)) from None


def main():
    customer = "py-" + uuid.uuid4().hex[:8]
    order_id = str(uuid.uuid4())
    order = {
        "schema_version": 2,
        "order_id": order_id,
        "workflow": "order_approval",
        "payload": {"customer": customer, "items": [{"sku": "BOOK-1", "qty": 2}], "amount": 4200, "currency": "EUR"},
    }
    status, _, body = call("POST", "/orders", order)
    print(f"submitted {order_id}: {status} {body['outcome']}")
    # Sending the same order again is safe: the same id and content
    # answers 200 with the order that exists.
    status, _, body = call("POST", "/orders", order)
    print(f"submitted again: {status} {body['outcome']}")

    # Wait until the order waits for its approval, then approve it.
    deadline = time.monotonic() + 60
    while True:
        _, _, view = call("GET", f"/orders/{order_id}")
        if any(s.get("process_state") == "awaiting" for s in view["steps"]):
            break
        if time.monotonic() > deadline:
            sys.exit(f"order {order_id} never waited for its approval: {view['order']['status']}")
        time.sleep(0.2)
    # A payload the wait's schema refuses is refused at once, with why
    # (sent while the wait awaits: once approved, it has ended).
    try:
        call("POST", f"/orders/{order_id}/signals/approved", {"who": "nobody"})
    except Problem as p:
        print(f"a bad approval is refused: {p.status} {p.doc.get('reason')}")
    status, _, _ = call("POST", f"/orders/{order_id}/signals/approved", {"by": "python example"})
    print(f"approved: {status}")

    # Await its end (long-poll, up to 30 s a call).
    while True:
        _, headers, event = call("GET", f"/orders/{order_id}/await?timeout=30s")
        if headers.get("Sas-Ended") == "true":
            break
    print(f"order {order_id} ended {event['status']}")

    # The customer's orders, by search attribute.
    query = urllib.parse.urlencode({"where": f"customer={customer}"})
    _, _, page = call("GET", f"/orders?{query}")
    print(f"orders of {customer}: {len(page['orders'])}")
    return 0 if event["status"] == "completed" else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Problem as p:
        sys.exit(f"the API refused: {p}")
    except urllib.error.URLError as e:
        sys.exit(f"the API at {API} did not answer: {e.reason}")
