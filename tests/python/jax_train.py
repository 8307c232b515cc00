"""A small jax trainer for test_jax.py: an MLP on a synthetic regression,
Adam written out by hand, checkpointed every --every steps through
ckpt.jax (--mode plain) or an Orbax CheckpointManager with ckpt.orbax
(--mode orbax); it resumes from the latest step there is. --crash-at N
SIGKILLs the process right after step N's save was sent (staged, not yet
durable). At the end it writes the trained state to --out (.npz)."""
import argparse
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np

LR, B1, B2, EPS = 1e-2, 0.9, 0.999, 1e-8


def init(key):
    k1, k2 = jax.random.split(key)
    params = {"w1": jax.random.normal(k1, (8, 32)) * 0.3, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, 1)) * 0.3, "b2": jnp.zeros(1)}
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"params": params, "opt": {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)},
            "key": jax.random.key_data(jax.random.key(7)), "step": 0}


def loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


@jax.jit
def train_step(state):
    """One step on a batch drawn from the state's own key."""
    key, sub = jax.random.split(jax.random.wrap_key_data(state["key"]))
    x = jax.random.normal(sub, (64, 8))
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    g = jax.grad(loss)(state["params"], x, y)
    opt = state["opt"]
    t = opt["t"] + 1
    m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, opt["m"], g)
    v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, opt["v"], g)
    tf = t.astype(jnp.float32)
    params = jax.tree.map(lambda p, m, v: p - LR * (m / (1 - B1 ** tf)) / (jnp.sqrt(v / (1 - B2 ** tf)) + EPS),
                          state["params"], m, v)
    return {"params": params, "opt": {"m": m, "v": v, "t": t}, "key": jax.random.key_data(key)}


class Plain:
    """ckpt.jax.Checkpointer directly."""

    def __init__(self, args):
        import ckpt.jax
        self.cp = ckpt.jax.Checkpointer(args.job, socket=args.socket)

    def resume(self, abstract):
        if self.cp.latest_step() is None:
            return None
        return self.cp.restore("latest", target=abstract)[1]

    def save(self, state, step):
        return self.cp.save(state, step)

    def close(self):
        self.cp.close()


class Orbax:
    """An Orbax CheckpointManager whose item goes through ckpt.orbax."""

    def __init__(self, args):
        import orbax.checkpoint as ocp

        import ckpt.orbax
        self.ocp, self.ck = ocp, ckpt.orbax
        handler = ckpt.orbax.Handler(args.job, socket=args.socket)
        self.mngr = ocp.CheckpointManager(args.dir, options=ocp.CheckpointManagerOptions(max_to_keep=2),
                                          handler_registry=ckpt.orbax.handler_registry(handler, "state"))

    def resume(self, abstract):
        step = self.mngr.latest_step()
        if step is None:
            return None
        got = self.mngr.restore(step, args=self.ocp.args.Composite(state=self.ck.Restore(abstract)))
        return got["state"]

    def save(self, state, step):
        self.mngr.save(step, args=self.ocp.args.Composite(state=self.ck.Save(state)))

    def close(self):
        self.mngr.wait_until_finished()
        self.mngr.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("plain", "orbax"), default="plain")
    ap.add_argument("--job", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dir")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--crash-at", type=int, default=-1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    saver = (Plain if args.mode == "plain" else Orbax)(args)
    state = init(jax.random.key(0))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x,
                            state)
    got = saver.resume(abstract)
    if got is not None:
        state = got
        print(f"resumed {state['step']}", flush=True)
    for step in range(state["step"] + 1, args.steps + 1):
        state = dict(train_step({k: state[k] for k in ("params", "opt", "key")}), step=step)
        if step % args.every == 0:
            saver.save(state, step)
            print(f"saved {step}", flush=True)
            if step == args.crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
    saver.close()
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    np.savez(args.out, **{jax.tree_util.keystr(p): np.asarray(x) for p, x in flat})


if __name__ == "__main__":
    main()
