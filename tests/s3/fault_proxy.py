"""A small HTTP proxy in front of moto that injects faults on command and
records the multipart uploads that stay open.

Rules (added with add_rule, consumed in order) match a request by method and
a substring of its path+query, and then, for `count` matching requests:
  - ("status", code, s3_code): answer with that HTTP status and an S3 error
    body (503 SlowDown, 500 InternalError, 403 AccessDenied ...);
  - ("reset", nbytes): read nbytes of the request body, then reset the
    connection (RST) in the middle of it;
  - ("delay", seconds): wait, then forward (latency);
  - ("lose_answer",): forward, then reset the connection instead of
    answering (the request took effect, the client never hears so);
count -1 means for ever. A rule with a rate below 1 hits each matching
request only with that probability (seeded, see seed()); a request it
spares goes on to the next rule, and only hits use up its count, so
add_rule("GET", "", ("status", 503, "SlowDown"), count=-1, rate=0.5) then
add_rule("GET", "", ("reset", 0), count=-1, rate=0.5) fails 75% of GETs,
half of them with a 503 and half with a reset. Everything else is forwarded unchanged, Host header
included, so moto checks the client's SigV4 signature as signed.

gcs mode: every request must carry "Authorization: Bearer <token>" with a
token the fake metadata server issued (401 otherwise) and no x-amz-* header
(400); uploads (PUT) must carry x-goog-hash; the Authorization header is
then replaced with a dummy one before forwarding, since the moto behind runs
without IAM mode. Like GCS, a PUT with x-goog-if-generation-match: 0 gets
412 when the object exists, and If-None-Match (S3's create-only header,
which GCS's XML API does not honour on PUT) is refused.
"""
import base64
import http.client
import http.server
import importlib.util
import os
import random
import re
import socket
import struct
import threading
import time
import urllib.parse


def _load_crc32c():
    # ckpt.format's pure-Python CRC32C, loaded by path: importing the ckpt
    # package would load libckpt, which is ASan-instrumented in that build.
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python", "ckpt",
                        "format.py")
    spec = importlib.util.spec_from_file_location("ckpt_format_for_proxy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.crc32c


_crc32c = _load_crc32c()


def crc32c_b64(data):
    return base64.b64encode(_crc32c(data).to_bytes(4, "big")).decode()


def _self_signed(d):
    import datetime
    import ipaddress
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ckptd test proxy")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    with open(cert_file, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_file, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return cert_file


class FaultProxy:
    def __init__(self, upstream_port, gcs_token=None, forbid_amz_checksum=False, tls_dir=None, host="127.0.0.1",
                 port=0):
        """gcs_token: a function that says whether a bearer token is valid
        (gcs mode), or None. forbid_amz_checksum: refuse x-amz-checksum-*
        headers without gcs mode (gs:// with HMAC keys, signed by SigV4).
        tls_dir: serve HTTPS with a self-signed certificate for 127.0.0.1
        written there as cert.pem (the CA bundle a client must be given).
        host, port: where it listens (the chaos soak's bridge address)."""
        self.upstream_port = upstream_port
        self.gcs_token = gcs_token
        self.forbid_amz_checksum = forbid_amz_checksum
        self.lock = threading.Lock()
        self.rules = []
        self.rng = random.Random(0)
        self.log = []               # (method, path, status)
        self.open_uploads = {}      # upload id -> key
        self.seen_headers = []      # (method, path, {lowercase name: value})
        # Check every upload's CRC32C header against its body, as S3 and GCS
        # do (400 BadDigest); moto itself does not.
        self.verify_checksums = False
        # Stand for a store that ignores create-only PUTs (If-None-Match: *,
        # x-goog-if-generation-match: 0): the server's 412 becomes a 200,
        # as if it had written (it has not: a GET gives the old bytes).
        self.ignore_conditional = False
        # GCS's create-only PUT (x-goog-if-generation-match: 0) answered as
        # GCS does, 412 when the object exists: a function of the request's
        # path ("/bucket/key", as sent) and Host saying whether it does. In
        # gcs mode a HEAD to the moto behind (no IAM: any signature);
        # outside it, given by the test (the HMAC-key tests, whose moto in
        # IAM mode ignores the header).
        self.object_exists = self._head_exists if gcs_token is not None else None
        self.checked = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _reply(self, code, body=b"", headers=(), head_length=None):
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                # HEAD: the length of the body a GET would get
                self.send_header("Content-Length", str(len(body) if head_length is None else head_length))
                self.end_headers()
                if body and self.command != "HEAD":
                    self.wfile.write(body)

            def _error(self, code, s3code, msg):
                body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{s3code}</Code>"
                        f"<Message>{msg}</Message></Error>").encode()
                self._reply(code, body, [("Content-Type", "application/xml")])

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                rule = proxy._match(self.command, self.path)
                hdrs = {k.lower(): v for k, v in self.headers.items()}
                with proxy.lock:
                    proxy.seen_headers.append((self.command, self.path, hdrs))
                if rule and rule[0] == "reset":
                    self.rfile.read(min(length, rule[1]))
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    proxy._record(self.command, self.path, "reset")
                    return
                body = self.rfile.read(length) if length else b""
                if rule and rule[0] == "status":
                    proxy._record(self.command, self.path, rule[1])
                    return self._error(rule[1], rule[2], "injected by the fault proxy")
                if rule and rule[0] == "delay":
                    time.sleep(rule[1])
                if proxy.verify_checksums and self.command == "PUT":
                    sent = hdrs.get("x-amz-checksum-crc32c") or hdrs.get("x-goog-hash", "").replace("crc32c=", "")
                    if sent != crc32c_b64(body):
                        proxy._record(self.command, self.path, 400)
                        return self._error(400, "BadDigest", f"CRC32C {sent!r} does not match the body")
                    with proxy.lock:
                        proxy.checked += 1
                if proxy.forbid_amz_checksum and any(k.startswith("x-amz-checksum") for k in hdrs):
                    proxy._record(self.command, self.path, 400)
                    return self._error(400, "InvalidArgument", "AWS checksum header sent to GCS")
                if proxy.gcs_token is not None:
                    auth = hdrs.get("authorization", "")
                    if not auth.startswith("Bearer ") or not proxy.gcs_token(auth[7:]):
                        proxy._record(self.command, self.path, 401)
                        return self._error(401, "AuthenticationRequired", "bad or missing bearer token")
                    if any(k.startswith("x-amz") for k in hdrs):
                        proxy._record(self.command, self.path, 400)
                        return self._error(400, "InvalidArgument", "x-amz-* header sent to GCS with OAuth")
                    if self.command == "PUT" and "x-goog-hash" not in hdrs:
                        proxy._record(self.command, self.path, 400)
                        return self._error(400, "InvalidArgument", "upload without x-goog-hash")
                    if "if-none-match" in hdrs:
                        proxy._record(self.command, self.path, 400)
                        return self._error(400, "InvalidArgument", "If-None-Match sent to GCS")
                if (proxy.object_exists and self.command == "PUT" and hdrs.get("x-goog-if-generation-match") == "0"
                        and proxy.object_exists(self.path.split("?")[0], self.headers.get("Host", ""))):
                    proxy._record(self.command, self.path, 412)
                    return self._error(412, "PreconditionFailed", "generation 0 does not match")
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                fwd = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                if proxy.gcs_token is not None:
                    fwd = {k: v for k, v in fwd.items() if k.lower() != "authorization"}
                    # moto without IAM mode does not check it, but treats a
                    # request without any as anonymous (403 on GET).
                    fwd["Authorization"] = ("AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, "
                                            "SignedHeaders=host, Signature=" + "0" * 64)
                conn.request(self.command, self.path, body=body, headers=fwd)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                proxy._track(self.command, self.path, resp.status, data)
                if rule and rule[0] == "lose_answer":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    proxy._record(self.command, self.path, "lost")
                    return
                if proxy.ignore_conditional and self.command == "PUT" and resp.status == 412:
                    # A store without conditional writes: it says it wrote.
                    proxy._record(self.command, self.path, "ignored-412")
                    return self._reply(200, b"", [("ETag", '"' + "0" * 32 + '"')])
                proxy._record(self.command, self.path, resp.status)
                out = [(k, v) for k, v in resp.getheaders()
                       if k.lower() not in ("content-length", "connection", "transfer-encoding", "server", "date")]
                self._reply(resp.status, data, out,
                            resp.getheader("Content-Length") if self.command == "HEAD" else None)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}"
        if tls_dir:
            import ssl
            self.ca_file = _self_signed(tls_dir)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.ca_file, os.path.join(tls_dir, "key.pem"))
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.endpoint = f"https://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _head_exists(self, path, host):
        head = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
        head.request("HEAD", path, headers={
            "Host": host,
            "Authorization": "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, "
                             "SignedHeaders=host, Signature=" + "0" * 64})
        exists = head.getresponse().status == 200
        head.close()
        return exists

    def add_rule(self, method, match, action, count=1, rate=1.0):
        with self.lock:
            self.rules.append([method, match, action, count, rate])

    def seed(self, n):
        with self.lock:
            self.rng.seed(n)

    def clear(self):
        with self.lock:
            self.rules.clear()
            self.log.clear()
            self.seen_headers.clear()

    def _match(self, method, path):
        with self.lock:
            for r in self.rules:
                if r[3] != 0 and (r[0] is None or r[0] == method) and r[1] in path:
                    if r[4] < 1.0 and self.rng.random() >= r[4]:
                        continue
                    if r[3] > 0:
                        r[3] -= 1
                    return r[2]
        return None

    def _record(self, method, path, status):
        with self.lock:
            self.log.append((method, path, status))

    def _track(self, method, path, status, data):
        if not 200 <= status < 300:
            return
        with self.lock:
            if method == "POST" and re.search(r"[?&]uploads(=|&|$)", path):
                m = re.search(rb"<UploadId>([^<]+)</UploadId>", data)
                if m:
                    self.open_uploads[m.group(1).decode()] = path.split("?")[0]
            m = re.search(r"[?&]uploadId=([^&]+)", path)
            if m and (method == "DELETE" or (method == "POST" and b"<Error>" not in data)):
                self.open_uploads.pop(urllib.parse.unquote(m.group(1)), None)

    def count(self, method, match, status=None):
        with self.lock:
            return sum(1 for m, p, s in self.log if m == method and match in p and (status is None or s == status))

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
