"""commrt inside PyTorch: the torch.distributed backend "commrt" and the tensor adapter.

``import commrt.torch`` registers both (``import torch`` alone does it where
the ``torch.backends`` entry point is installed, torch >= 2.5); the backend
module itself (``commrt.torch.backend``) loads on the first
``init_process_group("commrt")``, so ``import torch`` stays cheap.  This
package and ``commrt.horovod`` are the only ones that import torch (DESIGN.md).
"""
from commrt.torch._tensor import as_numpy, contiguous, describe_tensor, to_tensor  # noqa: F401

__all__ = ["as_numpy", "to_tensor", "describe_tensor", "contiguous", "ProcessGroupCommrt",
           "register"]


def _create(opts, backend_options=None):
    from commrt.torch.backend import create

    return create(opts, backend_options)


def register():
    """Register the backend "commrt" with torch.distributed (idempotent)."""
    import torch.distributed as dist

    if not dist.is_available() or "COMMRT" in dist.Backend._plugins:
        return
    dist.Backend.register_backend("commrt", _create, extended_api=True, devices=["cpu"])


def __getattr__(name):
    if name == "ProcessGroupCommrt":
        from commrt.torch.backend import ProcessGroupCommrt

        return ProcessGroupCommrt
    raise AttributeError(f"module 'commrt.torch' has no attribute {name!r}")


register()
