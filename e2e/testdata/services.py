#!/usr/bin/env python3
"""A team's own services, standard library only, as sas's agents call them
(docs/remote-service.openapi.yaml): POST /v1/ACTION with the order's
payload; the Idempotency-Key makes a repeat answer the same.

- check answers at once with a result;
- export answers 202 Accepted and finishes later: a heartbeat, then the
  step's completion, posted to the sas API with the step's token alone
  (the requests curl would send: POST $SAS_API_URL/api/v1/steps/heartbeat
  and /steps/complete with the header Sas-Step-Token).

    SAS_API_URL=http://127.0.0.1:8090 python3 services.py 127.0.0.1:9000
"""

import json
import os
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API = os.environ["SAS_API_URL"].rstrip("/") + "/api/v1"
answers = {}  # Idempotency-Key: the answer given
lock = threading.Lock()
workers = []


def call_back(what, token, body=None):
    req = urllib.request.Request(f"{API}/steps/{what}", method="POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Sas-Step-Token": token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def finish_export(token, key):
    call_back("heartbeat", token)
    call_back("complete", token, {"file": f"s3://exports/{key}.csv"})


class Service(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        key = self.headers.get("Idempotency-Key", "")
        action = self.path.rsplit("/", 1)[-1]
        if action not in ("check", "export"):
            self.answer(404, {"error": f"no action {action}"})
            return
        with lock:
            first = key not in answers
            if first:
                answers[key] = {"checked": body.get("payload", {}).get("customer", "")} if action == "check" else {"queued": True}
            doc = answers[key]
        if action == "check":
            self.answer(200, doc)
            return
        self.answer(202, doc)
        if first:
            t = threading.Thread(target=finish_export, args=(self.headers["Sas-Step-Token"], key.replace("/", "_")))
            with lock:
                workers.append(t)
            t.start()

    def answer(self, status, doc):
        raw = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    host, port = sys.argv[1].rsplit(":", 1)
    server = ThreadingHTTPServer((host, int(port)), Service)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        for t in workers:
            t.join()
