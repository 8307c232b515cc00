"""The S3 peer of the s3 suite: a moto server on 127.0.0.1 in IAM mode.

INITIAL_NO_AUTH_ACTION_COUNT lets the first few requests through unsigned;
setup() spends them creating an IAM user, an access key and an s3:* policy.
From then on moto recomputes every SigV4 signature with botocore and checks
the caller's IAM policy, so a request signed wrongly gets a 403.
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import boto3

REGION = "us-east-1"
POLICY = {"Version": "2012-10-17",
          "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:AssumeRole", "iam:CreateRole", "iam:PutRolePolicy"],
                        "Resource": "*"}]}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Moto:
    name = "moto"

    def __init__(self, logdir, iam=True):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        if iam:
            # enough for the IAM setup below, and not one request more
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"
        self.log = open(os.path.join(logdir, "moto.log"), "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=self.log, env=env)
        for _ in range(300):
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("moto_server did not start")
        self.access_key = self.secret_key = None
        if iam:
            self._iam_setup()

    def _iam_setup(self):
        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION,
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="ckptd")
        arn = iam.create_policy(PolicyName="s3-all", PolicyDocument=json.dumps(POLICY))["Policy"]["Arn"]
        iam.attach_user_policy(UserName="ckptd", PolicyArn=arn)
        key = iam.create_access_key(UserName="ckptd")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def role_credentials(self):
        """Temporary credentials (with a session token, which moto checks)
        of a role allowed s3:*: what STS web identity and IMDSv2 hand out."""
        kw = dict(endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=self.access_key,
                  aws_secret_access_key=self.secret_key)
        if not getattr(self, "_role_arn", None):
            iam = boto3.client("iam", **kw)
            trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
                                                              "Action": "sts:AssumeRole"}]}
            self._role_arn = iam.create_role(RoleName="ckptd-role",
                                             AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
            iam.put_role_policy(RoleName="ckptd-role", PolicyName="s3", PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        c = boto3.client("sts", **kw).assume_role(RoleArn=self._role_arn, RoleSessionName="ckptd")["Credentials"]
        return c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"]

    def client(self, access_key=None, secret_key=None):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=access_key or self.access_key or "test",
                            aws_secret_access_key=secret_key or self.secret_key or "test")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
