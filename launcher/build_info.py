"""commrt-launch --check-build: what this installation offers, as horovodrun prints it.

The first part has horovodrun's layout and answers as the build queries of
commrt's Horovod API do (a CPU build with Gloo: scripts that read it take
their CPU paths); the second says what commrt itself found.  Nothing heavy
is imported: each part is looked up with importlib.util.find_spec.
"""
import importlib.util


def _found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):     # a parent package missing or broken
        return False


def _box(flag):
    return "[X]" if flag else "[ ]"


def describe():
    """The text --check-build prints."""
    from commrt import __version__

    torch = _found("torch")
    horovod_api = _found("commrt.horovod")
    lines = [f"commrt v{__version__} (horovodrun --check-build's form):", "",
             "Available Frameworks:",
             f"    {_box(False)} TensorFlow",
             f"    {_box(torch and horovod_api)} PyTorch",
             f"    {_box(False)} MXNet", "",
             "Available Controllers:",
             f"    {_box(False)} MPI",
             f"    {_box(True)} Gloo", "",
             "Available Tensor Operations:",
             f"    {_box(False)} NCCL",
             f"    {_box(False)} DDL",
             f"    {_box(False)} CCL",
             f"    {_box(False)} MPI",
             f"    {_box(True)} Gloo", "",
             "commrt:",
             f"    {_box(_found('commrt.transport._core'))} compiled transport core "
             "(shared memory on one host, TCP across hosts)",
             f"    {_box(_found('commrt.kernels._combine'))} compiled reduction loops",
             f"    {_box(_found('numba'))} Numba kernels",
             f"    {_box(_found('cupy'))} CuPy (GPU buffers, staged through host memory)",
             f"    {_box(torch and _found('commrt.torch'))} torch.distributed backend \"commrt\"",
             f"    {_box(horovod_api)} Horovod API (commrt.horovod)",
             ""]
    return "\n".join(lines)
