"""Horovod's exceptions, under Horovod's names.

HorovodInternalError is what a collective raises when the job itself broke (a
peer died, the coordinator stopped): ``hvd.elastic.run`` restores the last
commit and re-forms the job on it.  A mismatch of one operation across ranks
(shape, dtype, op) is not internal: the job goes on, so it raises
HorovodMismatchError, which is a RuntimeError as Horovod's errors are.
"""


class HorovodInternalError(RuntimeError):
    """The job broke under a collective (a lost peer, a stopped coordinator)."""


class HorovodMismatchError(RuntimeError):
    """Ranks submitted one named operation with different shapes, dtypes or ops."""


class HostsUpdatedInterrupt(RuntimeError):
    """The elastic driver added or removed workers; raised at the next commit."""

    def __init__(self, skip_sync=False):
        self.skip_sync = skip_sync
        super().__init__("the elastic job's hosts changed")
