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
__all__ = ["Client", "Buffer", "TensorSpec", "SaveFuture", "LoadFuture", "CkptError", "DaemonUnavailable",
           "Superseded", "NotReplicated", "LATEST", "default_socket", "cuda_available", "cuda_identity",
           "cuda_allocation"]


def __getattr__(name):
    """Module attribute lookup (PEP 562): a name in __all__ is returned from
    ckpt.client, imported on first use (which loads libckpt), so that
    import ckpt and import ckpt.format need no library. Raises
    AttributeError for any other name."""
    if name in __all__:
        from . import client
        return getattr(client, name)
    raise AttributeError(f"module 'ckpt' has no attribute '{name}'")
