"""Reduction operations of the collectives: ``commrt.ReduceOp`` and ``commrt.SUM`` etc.

Each member names its element-wise kernel in ``commrt.kernels`` (AVG reduces
with sum, then divides by the number of ranks) and has a small code carried
in every collective message's fingerprint.
"""
import enum


class ReduceOp(enum.Enum):
    """How a reducing collective combines the ranks' buffers, element by element.

    SUM, PROD, MIN, MAX    arithmetic (on bool: SUM and MAX are or, PROD and MIN and)
    AVG                    SUM divided by the number of ranks (floor division for integers)
    LAND, LOR              logical and/or: 0/1 in the buffer's dtype
    BAND, BOR, BXOR        bitwise, integers and bool only
    """

    SUM = 1
    PROD = 2
    MIN = 3
    MAX = 4
    AVG = 5
    LAND = 6
    LOR = 7
    BAND = 8
    BOR = 9
    BXOR = 10

    # Members are singletons: identity hashing keeps kernel-table lookups cheap
    # (Enum's default hashes the name in Python).
    __hash__ = object.__hash__

    @property
    def kernel(self):
        """The name of the element-wise kernel this op reduces with."""
        return _KERNEL[self]

    @classmethod
    def parse(cls, op):
        """A ReduceOp from a member, its name (any case) or its value."""
        if isinstance(op, cls):
            return op
        if isinstance(op, str):
            try:
                return cls[op.upper()]
            except KeyError:
                pass
        elif isinstance(op, int):
            try:
                return cls(op)
            except ValueError:
                pass
        raise ValueError(f"unknown reduction {op!r}; expected one of "
                         f"{', '.join(m.name for m in cls)}")


_KERNEL = {op: ("sum" if op is ReduceOp.AVG else op.name.lower()) for op in ReduceOp}

SUM = ReduceOp.SUM
PROD = ReduceOp.PROD
MIN = ReduceOp.MIN
MAX = ReduceOp.MAX
AVG = ReduceOp.AVG
LAND = ReduceOp.LAND
LOR = ReduceOp.LOR
BAND = ReduceOp.BAND
BOR = ReduceOp.BOR
BXOR = ReduceOp.BXOR
