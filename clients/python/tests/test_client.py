"""The Python client against a real stack (make test runs it: e2e
TestPythonClientAgainstARealStack starts the stack and this service).

Environment: SAS_API_URL and SAS_API_TOKEN (an operator token) of the
API; SAS_TEST_SERVICE_ADDR, where this test serves the remote service the
agents call (it answers build_export 202 Accepted, every other action at
once). The workflows are the e2e test's (shop, approval, export).
"""

import json
import os
import queue
import threading
import unittest
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sas_client import Client, Problem

TOKENS = queue.Queue()  # (order_id, step token) of each build_export call


class Service(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path.endswith("/build_export"):
            TOKENS.put((body.get("order_id"), self.headers.get("Sas-Step-Token")))
            self.send_response(202)
            self.end_headers()
            return
        answer = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def setUpModule():
    global SERVER, THREAD
    host, port = os.environ["SAS_TEST_SERVICE_ADDR"].rsplit(":", 1)
    SERVER = ThreadingHTTPServer((host, int(port)), Service)
    THREAD = threading.Thread(target=SERVER.serve_forever)
    THREAD.start()


def tearDownModule():
    SERVER.shutdown()
    THREAD.join()
    SERVER.server_close()


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.sas = Client(os.environ["SAS_API_URL"], token=os.environ["SAS_API_TOKEN"])

    def test_submit_await_and_submit_again(self):
        customer = "py-" + uuid.uuid4().hex[:8]
        order = self.sas.submit("shop", {"customer": customer, "amount": 12})
        self.assertEqual(order["outcome"], "inserted")
        again = self.sas.submit("shop", {"customer": customer, "amount": 12}, order_id=order["order_id"])
        self.assertEqual(again["outcome"], "duplicate")
        with self.assertRaises(Problem) as other:
            self.sas.submit("shop", {"customer": customer, "amount": 13}, order_id=order["order_id"])
        self.assertEqual(other.exception.status, 409)
        event, ended = self.sas.await_end(order["order_id"], timeout="30s")
        self.assertTrue(ended)
        self.assertEqual(event["status"], "completed")
        view = self.sas.get(order["order_id"])
        self.assertEqual(view["order"]["status"], "completed")
        # Found by its search attribute, page after page.
        page = self.sas.list(where=[f"customer={customer}"])
        self.assertEqual([o["order_id"] for o in page["orders"]], [order["order_id"]])
        self.assertIn(order["order_id"], [o["order_id"] for o in self.sas.orders(workflow="shop", limit=1)])

    def test_follow_each_step_and_signal(self):
        # The wait begins a second after the order: the stream is there
        # before it.
        order = self.sas.submit("approval", {})
        seen = []
        for kind, event in self.sas.follow(order["order_id"], steps=True):
            seen.append((kind, event.get("status") or event.get("event")))
            if kind == "step" and event["event"] == "awaiting":
                self.assertEqual(event["wait"], "approved")
                with self.assertRaises(Problem) as bad:
                    self.sas.signal(order["order_id"], "approved", {"who": "nobody"})
                self.assertEqual(bad.exception.status, 422)
                self.assertEqual(bad.exception.reason, "invalid_payload")
                sent = self.sas.signal(order["order_id"], "approved", {"by": "ann"}, idempotency_key="approve-once")
                self.assertEqual(sent["signal_id"], "approve-once")
        self.assertIn(("step", "awaiting"), seen)
        self.assertEqual(seen[-1], ("status", "completed"))

    def test_a_service_calls_back_with_its_token(self):
        order = self.sas.submit("export", {})
        while True:
            order_id, token = TOKENS.get(timeout=60)
            if order_id == order["order_id"]:
                break
        callbacks = Client(os.environ["SAS_API_URL"])  # the step token is the credential
        held = callbacks.heartbeat(token)
        self.assertEqual(held["outcome"], "applied")
        self.assertIn("complete_by", held)
        done = callbacks.complete(token, {"file": "s3://exports/1.csv"})
        self.assertEqual((done["outcome"], done["order_id"], done["step"]), ("applied", order["order_id"], 1))
        with self.assertRaises(Problem) as again:
            callbacks.complete(token, {"file": "s3://exports/1.csv"})
        self.assertEqual((again.exception.status, again.exception.reason), (409, "duplicate"))
        with self.assertRaises(Problem) as late:
            callbacks.fail(token, "too late")
        self.assertEqual(late.exception.reason, "stale_token")
        with self.assertRaises(Problem) as forged:
            callbacks.complete(token[:-2] + ("AA" if not token.endswith("AA") else "BB"), {})
        self.assertEqual((forged.exception.status, forged.exception.reason), (403, "invalid_token"))
        event, ended = self.sas.await_end(order["order_id"], timeout="30s")
        self.assertTrue(ended)
        self.assertEqual(event["status"], "completed")
        self.assertEqual(event["results"]["build_export"], {"file": "s3://exports/1.csv"})

    def test_refusals_are_problems(self):
        with self.assertRaises(Problem) as unknown:
            self.sas.get(str(uuid.uuid4()))
        self.assertEqual(unknown.exception.status, 404)
        with self.assertRaises(Problem) as no_token:
            Client(os.environ["SAS_API_URL"]).get(str(uuid.uuid4()))
        self.assertEqual(no_token.exception.status, 401)


if __name__ == "__main__":
    unittest.main()
