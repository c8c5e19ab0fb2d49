"""The reduction an algorithm combines with: ``red(dst, src)`` (dst = dst OP src),
``red.first(dst, src)`` (dst = src OP dst: the operand order of the lower rank),
``red.many(dst, srcs)`` (one pass over several sources, float16 accumulating in
float32), and ``red.hook``, the address of the same reduction as a C loop for
receives that combine as the data lands (0 where there is none: bool,
complex, logical ops; float16 has one).  Algorithms do not look at ``hook``: they
combine messages with ``Call.recv_combine`` / ``Call.irecv_combine``, which
pick a reduce-receive or a receive into scratch plus ``red``; ``red.lands``
says which, for algorithms whose posting pattern depends on it (how many
receives may be in flight)."""


class Reduction:
    __slots__ = ("op", "kernel", "dtype", "parallel", "hook", "_c", "_into", "_many")

    def __init__(self, op, kernel, dtype, parallel):
        from commrt.kernels import combine_address, combine_into

        self.op, self.kernel, self.dtype, self.parallel = op, kernel, dtype, parallel
        self.hook = combine_address(kernel, dtype)
        # Where there is a C loop the Python-side combine uses it too: the same
        # bits as a reduce-receive, the GIL released, and no Numba import or
        # cached-kernel load on a job's first collective (1-10 s here).
        self._c = combine_into if self.hook and parallel is not True else None
        self._into = self._many = None

    @property
    def lands(self):
        """Whether received messages are combined as they land (no scratch)."""
        return bool(self.hook)

    def __call__(self, dst, src):
        if self._c is not None:
            try:
                self._c(dst, src, self.kernel)
                return
            except (TypeError, ValueError, BufferError):   # not a contiguous pair: the kernels
                pass
        if self._into is None:
            self._load()
        self._into(dst, src, self.kernel, parallel=self.parallel)

    def first(self, dst, src):
        """dst = src OP dst: src the left operand, the result in dst (no copy back
        where there is a C loop; else through a copy of src)."""
        if self._c is not None:
            try:
                self._c(dst, src, self.kernel, True)
                return
            except (TypeError, ValueError, BufferError):
                pass
        tmp = src.copy()
        self(tmp, dst)
        dst[...] = tmp

    def many(self, dst, srcs):
        if self._many is None:
            self._load()
        self._many(dst, srcs, self.kernel, parallel=self.parallel)

    def _load(self):
        from commrt.kernels.reduce import reduce_into, reduce_into_many

        self._into, self._many = reduce_into, reduce_into_many
