"""ckpt: the Python client of ckptd.

    import ckpt.torch
    with ckpt.torch.Checkpointer("my-job") as cp:    # rank: the launcher's
        fut = cp.save(state_dict, step)
        fut.staged.result()     # tensors may change again
        ...
        step, extra = cp.load(state_dict)

ckpt.Client is the raw binding; ckpt.dcp has a torch.distributed.checkpoint
StorageWriter/StorageReader; ckpt.format reads a step without the daemon.
"""
from .client import (LATEST, Buffer, CkptError, Client, DaemonUnavailable, LoadFuture, SaveFuture, Superseded,
                     TensorSpec, cuda_available, default_socket)

__all__ = ["Client", "Buffer", "TensorSpec", "SaveFuture", "LoadFuture", "CkptError", "DaemonUnavailable",
           "Superseded", "LATEST", "default_socket", "cuda_available"]
