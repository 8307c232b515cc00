"""Differential test of ckptd's SigV4 signer against botocore's: random S3
requests (odd characters in keys and query values, valueless query keys,
repeated spaces in header values), signed by both, must match exactly."""
import datetime
import json
import os
import random
import subprocess
from unittest import mock
from urllib.parse import quote

import pytest

auth = pytest.importorskip("botocore.auth")
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402

CHARS = "abcXYZ019-_.~ /+=&?%!*'()[]@$,;:é"


def rand_str(rng, n):
    return "".join(rng.choice(CHARS) for _ in range(rng.randint(1, n)))


def case(rng, i):
    key = "/" + "/".join(rand_str(rng, 12).replace("/", "x") for _ in range(rng.randint(1, 3)))
    params = []
    for k in range(rng.randint(0, 4)):
        name = rng.choice(["uploads", "partNumber", "uploadId", "prefix", "max-keys", f"x{k}"])
        if any(p[0] == name for p in params):
            continue
        params.append((name, None if name == "uploads" else rand_str(rng, 10)))
    query = "&".join(f"{quote(k, safe='~')}" + ("" if v is None else "=" + quote(v, safe="~")) for k, v in params)
    url = "https://bucket.s3.us-west-2.amazonaws.com" + quote(key, safe="/~") + ("?" + query if query else "")
    headers = {"Content-Type": "application/octet-stream", "X-Amz-Meta-Note": "  a   b " + rand_str(rng, 5)}
    body = os.urandom(rng.randint(0, 64)) if rng.random() < 0.5 else b""
    req = AWSRequest(method=rng.choice(["GET", "PUT", "POST", "DELETE", "HEAD"]), url=url, headers=headers, data=body)
    return req, key, params


def test_matches_botocore():
    rng = random.Random(1234)
    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    fixed = datetime.datetime(2026, 11, 21, 12, 34, 56)
    lines, want = [], []
    with mock.patch("botocore.auth.get_current_datetime", return_value=fixed):
        for i in range(300):
            req, key, params = case(rng, i)
            auth.S3SigV4Auth(creds, "s3", "us-west-2").add_auth(req)
            want.append(req.headers["Authorization"])
            hdrs = [[k, v] for k, v in req.headers.items() if k.lower() != "authorization"]
            hdrs.append(["host", "bucket.s3.us-west-2.amazonaws.com"])
            # the same parameters, unencoded: our signer encodes them
            q = [[k, v] for k, v in params]
            lines.append(json.dumps({
                "method": req.method, "path": key, "query": q, "headers": hdrs,
                "payload": req.headers["X-Amz-Content-SHA256"], "date": req.headers["X-Amz-Date"],
                "region": "us-west-2", "service": "s3", "ak": creds.access_key, "sk": creds.secret_key}))
    out = subprocess.run([os.environ["SIGV4_CLI"]], input="\n".join(lines) + "\n", capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert len(out) == len(want)
    bad = [(i, a, b) for i, (a, b) in enumerate(zip(out, want)) if a != b]
    assert not bad, f"{len(bad)} of {len(want)} differ; first: {bad[0]}"
