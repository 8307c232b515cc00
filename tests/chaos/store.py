"""The chaos soak's object store, run by tests/chaos/run inside the bridge
namespace: moto in IAM mode on that namespace's loopback, a bucket, and
the fault proxy (tests/s3/fault_proxy.py) listening on the bridge's
address, the only way the nodes reach the store.

It prints one JSON line (endpoint, bucket, access key, secret), then reads
commands, one a line, and answers each with one line:

  faults RATE SEED   from now on a request fails with probability RATE:
                     a third 503 SlowDown, a third a reset in the middle of
                     its body, a third its answer lost after it took
                     effect (seeded)
  clear              no more faults
  count              "REQUESTS FAULTED" since the start
  keys               every key in the bucket, as one JSON list
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "s3"))
from fault_proxy import FaultProxy  # noqa: E402
from moto_harness import Moto  # noqa: E402


def main():
    host, logdir = sys.argv[1], sys.argv[2]
    moto = Moto(logdir)
    moto.client().create_bucket(Bucket="chaos")
    proxy = FaultProxy(moto.port, host=host)
    print(json.dumps({"endpoint": proxy.endpoint, "bucket": "chaos", "access_key": moto.access_key,
                      "secret_key": moto.secret_key}), flush=True)
    seen = faulted = 0
    for line in sys.stdin:
        words = line.split()
        with proxy.lock:
            # The proxy's logs would grow for the whole soak: count, drop.
            seen += len(proxy.log)
            faulted += sum(1 for _, _, status in proxy.log if status in (503, "reset", "lost"))
            proxy.log.clear()
            proxy.seen_headers.clear()
        if words and words[0] == "faults":
            rate = float(words[1])
            proxy.clear()
            proxy.seed(int(words[2]))
            proxy.add_rule(None, "", ("status", 503, "SlowDown"), count=-1, rate=rate / 3)
            proxy.add_rule(None, "", ("reset", 1024), count=-1, rate=rate / 3 / (1 - rate / 3))
            proxy.add_rule(None, "", ("lose_answer",), count=-1, rate=rate / 3 / (1 - 2 * rate / 3))
        elif words and words[0] == "clear":
            proxy.clear()
        elif words and words[0] == "keys":
            keys = []
            for page in moto.client().get_paginator("list_objects_v2").paginate(Bucket="chaos"):
                keys += [o["Key"] for o in page.get("Contents", [])]
            print(json.dumps(keys), flush=True)
            continue
        elif words and words[0] == "count":
            print(f"{seen} {faulted}", flush=True)
            continue
        print("ok", flush=True)
    proxy.stop()
    moto.stop()


if __name__ == "__main__":
    main()
