"""Fake credential endpoints for the credential-chain tests, on one port:

- GCE metadata server: GET /computeMetadata/v1/instance/service-accounts/
  default/token (needs Metadata-Flavor: Google);
- an OAuth token endpoint for service-account keys: POST /token with a JWT
  bearer assertion whose RS256 signature is verified with `cryptography`
  against the key this server generated (sa_json() writes the key file);
- IMDSv2: PUT /latest/api/token, then GET /latest/meta-data/iam/
  security-credentials/[role] with the session token;
- STS: POST / Action=AssumeRoleWithWebIdentity with the expected token.

Tokens are numbered, so tests can count fetches (refreshes); valid() says
whether a bearer token was issued here.
"""
import base64
import json
import http.server
import threading
import time
import urllib.parse

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa


def _b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


class FakeMetadata:
    def __init__(self, aws_creds=None, web_identity_token="web-id-token", expires_in=3600):
        """aws_creds: a function returning (access key, secret, session token)
        that IMDSv2 and STS hand out (temporary credentials from moto's STS,
        so moto checks the session token too)."""
        self.aws_creds = aws_creds
        self.web_identity_token = web_identity_token
        self.expires_in = expires_in
        self.lock = threading.Lock()
        self.issued = set()
        self.counts = {"gce": 0, "jwt": 0, "imds": 0, "sts": 0}
        self.jwt_claims = []
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        me = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send(self, code, body, ctype="application/json"):
                data = body.encode() if isinstance(body, str) else body
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def do_GET(self):
                p = self.path
                if p == "/computeMetadata/v1/instance/service-accounts/default/token":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self.send(403, "{}")
                    return self.send(200, json.dumps(me._token("gce")))
                if p.startswith("/latest/meta-data/iam/security-credentials/"):
                    if self.headers.get("X-aws-ec2-metadata-token") != "imds-session":
                        return self.send(401, "")
                    role = p[len("/latest/meta-data/iam/security-credentials/"):]
                    if role == "":
                        return self.send(200, "ckpt-role\n", "text/plain")
                    if role != "ckpt-role":
                        return self.send(404, "")
                    with me.lock:
                        me.counts["imds"] += 1
                    exp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + me.expires_in))
                    ak, sk, tok = me.aws_creds()
                    return self.send(200, json.dumps({"Code": "Success", "AccessKeyId": ak, "SecretAccessKey": sk,
                                                      "Token": tok, "Expiration": exp}))
                self.send(404, "")

            def do_PUT(self):
                self.body()
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self.send(200, "imds-session", "text/plain")
                self.send(403, "")

            def do_POST(self):
                form = urllib.parse.parse_qs(self.body().decode())
                if self.path == "/token":
                    ok, why = me._check_jwt(form)
                    if not ok:
                        return self.send(400, json.dumps({"error": "invalid_grant", "error_description": why}))
                    return self.send(200, json.dumps(me._token("jwt")))
                if form.get("Action") == ["AssumeRoleWithWebIdentity"]:
                    if form.get("WebIdentityToken") != [me.web_identity_token] or not form.get("RoleArn"):
                        return self.send(403, "<ErrorResponse><Error><Code>AccessDenied</Code></Error>"
                                              "</ErrorResponse>", "text/xml")
                    with me.lock:
                        me.counts["sts"] += 1
                    exp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + me.expires_in))
                    ak, sk, tok = me.aws_creds()
                    xml = ("<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>"
                           f"<AccessKeyId>{ak}</AccessKeyId><SecretAccessKey>{sk}"
                           f"</SecretAccessKey><SessionToken>{tok}</SessionToken>"
                           f"<Expiration>{exp}</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
                           "</AssumeRoleWithWebIdentityResponse>")
                    return self.send(200, xml, "text/xml")
                self.send(404, "")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _token(self, kind):
        with self.lock:
            self.counts[kind] += 1
            tok = f"{kind}-token-{self.counts[kind]}"
            self.issued.add(tok)
        return {"access_token": tok, "expires_in": self.expires_in, "token_type": "Bearer"}

    def valid(self, token):
        with self.lock:
            return token in self.issued

    def sa_json(self, path, email="ckptd@test.iam.gserviceaccount.com"):
        pem = self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()).decode()
        with open(path, "w") as f:
            json.dump({"type": "service_account", "client_email": email, "private_key": pem,
                       "token_uri": self.url + "/token"}, f)
        return email

    def _check_jwt(self, form):
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            return False, "grant_type"
        parts = (form.get("assertion") or [""])[0].split(".")
        if len(parts) != 3:
            return False, "assertion is not a JWT"
        try:
            self.key.public_key().verify(_b64url_decode(parts[2]), f"{parts[0]}.{parts[1]}".encode(),
                                         padding.PKCS1v15(), hashes.SHA256())
        except Exception:
            return False, "bad RS256 signature"
        head, claims = json.loads(_b64url_decode(parts[0])), json.loads(_b64url_decode(parts[1]))
        if head.get("alg") != "RS256" or claims.get("aud") != self.url + "/token":
            return False, "alg or aud"
        if not claims.get("iat") or claims.get("exp", 0) <= time.time() or "devstorage" not in claims.get("scope", ""):
            return False, "iat, exp or scope"
        with self.lock:
            self.jwt_claims.append(claims)
        return True, ""

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
