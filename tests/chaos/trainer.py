"""One trainer rank of the chaos soak (tests/chaos/run), a process of its
own in its node's namespace, so that the driver can SIGKILL it in the
middle of a save or a load. It speaks libckpt (ckpt.Client) to its node's
daemon and takes commands on stdin, one JSON object a line, answering each
with one JSON line on stdout:

  {"op": "open", "rank": R, "world": W}   be rank R of a world of W
  {"op": "save", "step": S, "tier": T}    save step S, wait for the tier
  {"op": "persist", "step": S}            upload this node's memory copies of
                                          step S, wait until durable
  {"op": "resolve"}                       the latest step (pinned for the
                                          loads that follow, as one rank
                                          would broadcast it)
  {"op": "load", "step": S}               load step S, check its bytes

The job's one tensor "w" of step S is payload(S) (bytes a function of the
step only), of global length length(S); rank R of W holds the rows
[R*N/W, (R+1)*N/W). A load of another world's step reshards."""
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import ckpt  # noqa: E402

MAX_BYTES = 512 << 10
WAIT_S = 90


def payload(step):
    r = random.Random(f"chaos/{step}")
    return r.randbytes(64 + r.randrange(MAX_BYTES))


def box(n, rank, world):
    return n * rank // world, n * (rank + 1) // world


class Rank:
    def __init__(self, sock):
        self.sock = sock
        self.client = None
        self.rank = self.world = None

    def open(self, rank, world):
        if self.client is not None:
            self.client.close()
            self.client = None
        self.rank, self.world = rank, world
        self.client = ckpt.Client(socket=self.sock, job="chaos", rank=rank, world_size=world, attempt_id="soak")
        return {"ok": True}

    def spec(self, buf, n, lo, hi):
        return ckpt.TensorSpec("w", "u8", (n,), buf, 0, hi - lo, offsets=(lo,), lengths=(hi - lo,))

    def save(self, step, tier):
        data = payload(step)
        lo, hi = box(len(data), self.rank, self.world)
        b = self.client.alloc(max(1, hi - lo))
        try:
            b.view[:hi - lo] = data[lo:hi]
            f = self.client.save(step, [self.spec(b, len(data), lo, hi)], tier=tier)
            if tier == "durable":
                f.durable.result(timeout=WAIT_S)
            else:
                f.kept.result(timeout=WAIT_S)
                if tier == "replicated":
                    f.replicated.result(timeout=WAIT_S)
        finally:
            b.free()
        return {"ok": True}

    def persist(self, step):
        self.client.persist(step).durable.result(timeout=WAIT_S)
        return {"ok": True}

    def resolve(self):
        return {"ok": True, "step": self.client.resolve(ckpt.LATEST)}

    def load(self, step):
        data = payload(step)
        lo, hi = box(len(data), self.rank, self.world)
        b = self.client.alloc(max(1, hi - lo))
        try:
            res = self.client.load([self.spec(b, len(data), lo, hi)], step).result(WAIT_S)
            same = bytes(b.view[:hi - lo]) == data[lo:hi]
        finally:
            b.free()
        return {"ok": True, "step": res["step"], "same": same, "source": res.get("source", "")}


def main():
    r = Rank(sys.argv[1])
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] != "open" and r.client is None:
                r.open(r.rank, r.world)  # its daemon was down when it last tried
            if cmd["op"] == "open":
                out = r.open(cmd["rank"], cmd["world"])
            elif cmd["op"] == "save":
                out = r.save(cmd["step"], cmd["tier"])
            elif cmd["op"] == "persist":
                out = r.persist(cmd["step"])
            elif cmd["op"] == "resolve":
                out = r.resolve()
            else:
                out = r.load(cmd["step"])
        except Exception as e:  # the driver judges: an error is an answer
            out = {"ok": False, "err": f"{type(e).__name__}: {e}"}
            if r.client is not None and cmd["op"] != "open":
                # a broken session (its daemon killed) is opened again
                try:
                    r.open(r.rank, r.world)
                except Exception:
                    r.client = None
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
