"""The attempt id a Checkpointer's session gets when none is given: one
per launch, the same on every rank of it (docs/format.md "Attempts").

A step is complete when one attempt holds every rank's manifest, and a
rank's manifest is never overwritten. So two launches must not share an
attempt: a relaunch that saves again a step its dead predecessor saved on
some ranks would fail there (EEXIST) and complete the step with the other
ranks' new manifests, a step made of two launches' states. The launchers'
own ids do not always tell launches apart (torchrun's run id is "none"
unless given, a Kubernetes job's is its name, srun run twice in one
allocation keeps SLURM_JOB_ID and SLURM_RESTART_COUNT), so the id is the
launcher's part (libckpt's default: TORCHELASTIC_RUN_ID and
TORCHELASTIC_RESTART_COUNT, else SLURM_JOB_ID and SLURM_RESTART_COUNT,
else "run") and a nonce of this launch:

- one process (world size 1): a nonce of this process;
- ranks of torch.distributed: the first rank's nonce, agreed through the
  default process group's store (one compare_set per Checkpointer, no
  collective: the ranks need not create theirs together);
- processes of jax.distributed: the same through its key-value store.

Ranks of several processes with neither (RANK and WORLD_SIZE alone) keep
libckpt's default, the launcher's part alone; so does a store that fails.
torchelastic's restart count can differ between nodes after a restart,
and both the launcher's part and the store's key hold it: a load gathers
the ranks' ids and raises when they differ (check_agreed).
"""
from __future__ import annotations

import errno
import os
import re
import secrets
import warnings
from typing import Any, Callable, List, Optional

# This process's nonce: its Checkpointers share one attempt; a forked
# child gets its own.
_PROCESS = secrets.token_hex(4)


def _forked() -> None:
    global _PROCESS
    _PROCESS = secrets.token_hex(4)


os.register_at_fork(after_in_child=_forked)
# What may not stand in an attempt id (as a name in storage: libckpt's check).
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


def _launcher_part() -> str:
    """libckpt's default attempt id (client/conn.c default_attempt_id), or
    "run" where that is "default"; at most 100 characters of a name."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    job = os.environ.get("SLURM_JOB_ID")
    if run:
        part = f"{run}-{os.environ.get('TORCHELASTIC_RESTART_COUNT') or '0'}"
    elif job:
        part = f"slurm-{job}-{os.environ.get('SLURM_RESTART_COUNT') or '0'}"
    else:
        part = "run"
    return _NOT_NAME.sub("_", part)[:100]


def _restart() -> str:
    """The launch's restart count (a store may outlive a restart)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or "0"


def torch_agree(proposal: str) -> Optional[str]:
    """The launch's nonce through torch.distributed's default store: the
    first proposal made wins (compare_set), every rank gets it. None when
    torch.distributed is not initialized."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    store = dist.distributed_c10d._get_default_store()
    got = store.compare_set(f"ckptd/attempt/{_restart()}", "", proposal)
    return got.decode() if isinstance(got, bytes) else str(got)


def jax_agree(proposal: str) -> Optional[str]:
    """The launch's nonce through jax.distributed's key-value store: the
    first process's set wins (the others' fail), every process reads it.
    None without jax.distributed."""
    from jax._src import distributed
    client: Any = distributed.global_state.client
    if client is None:
        return None
    key = f"ckptd/attempt/{_restart()}"
    try:
        client.key_value_set(key, proposal)
    except Exception as e:
        if "ALREADY_EXISTS" not in str(e):  # else another process was first
            raise
    return str(client.blocking_key_value_get(key, 60_000))


def check_agreed(attempts: List[Optional[str]], job: str) -> None:
    """Raise CkptError(EINVAL) on every rank when the ranks' attempt ids
    (gathered at a load: torch.py _resolve_step) differ: no step of theirs
    could ever be complete. (torchelastic's restart count can differ
    between nodes after a restart, and libckpt's default and the store's
    key both hold it.)"""
    if len(set(attempts)) > 1:
        from .client import CkptError
        seen = sorted({str(a) for a in attempts})
        raise CkptError(errno.EINVAL, f"job '{job}': the ranks of this launch have different attempt ids "
                        f"({', '.join(seen[:4])}), so no step of theirs could ever be complete; give every rank "
                        "the same Checkpointer(attempt_id=...), one per launch (docs/format.md \"Attempts\")")


def default(world_size: int, agree: Optional[Callable[[str], Optional[str]]] = None) -> Optional[str]:
    """The attempt id of a rank of world_size when none is given (see the
    module's text); None: libckpt's default."""
    if world_size == 1:
        nonce: Optional[str] = _PROCESS
    elif agree is None:
        return None
    else:
        try:
            nonce = agree(secrets.token_hex(4))
        except Exception as e:  # the store did not answer: as before, the launcher's id alone
            warnings.warn(f"ckpt: no attempt id agreed between the ranks ({e}); using the launcher's, "
                          "which a relaunch may share: give Checkpointer(attempt_id=) one per launch",
                          stacklevel=3)
            return None
        if nonce is None:
            return None
    if not nonce or len(nonce) > 16 or _NOT_NAME.search(nonce):  # what another rank put in the store
        return None
    return f"{_launcher_part()}-{nonce}"
