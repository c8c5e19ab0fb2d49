"""The transport's frame header, written from Python, for the wire fuzzers.

The layout follows commrt/transport/structs.pxi (hdr_t); which revision is
chosen by the engine's own HEADER_BYTES, and test_fuzz_wire checks the codec
against frames a real engine writes, so a header change that this file does
not follow fails loudly instead of fuzzing nothing.
"""
import struct

from commrt.transport import _core

OPCODES = {"EAGER": 1, "RTS": 2, "CTS": 3, "DATA": 4, "FIN": 5, "ABORT": 6, "BYE": 7, "PAD": 8}

# revision 1: 56 bytes; revision 2: 64 bytes (credits, a second fingerprint word);
# revision 3 (split copies: new CTS and FIN meanings) keeps revision 2's layout
_LAYOUTS = {
    56: (struct.Struct("<IBBHiIiIQQQQ"), 0x54524D43, 1,
         ("magic", "version", "opcode", "dtype", "src", "ctx", "tag", "seq", "nbytes", "meta",
          "cookie", "addr")),
    64: (struct.Struct("<HBBiIiIIQQQQQ"), 0x4D43, _core.WIRE_VERSION,
         ("magic", "version", "opcode", "src", "ctx", "tag", "seq", "credit", "nbytes", "meta",
          "meta2", "cookie", "addr")),
}
HEADER_BYTES = _core.HEADER_BYTES
if HEADER_BYTES not in _LAYOUTS:
    raise ImportError(f"tests/faults/wire.py does not know the {HEADER_BYTES}-byte header")
HEADER, MAGIC, VERSION, FIELDS = _LAYOUTS[HEADER_BYTES]
if HEADER_BYTES == 64:
    OPCODES.update(CREDIT=9, BEAT=10)
SLOT = 64                                   # a ring record's header slot


def header(**fields):
    """Header bytes; unnamed fields are 0, magic and version are right unless given."""
    values = dict.fromkeys(FIELDS, 0)
    values.update(magic=MAGIC, version=VERSION)
    values.update(fields)
    return HEADER.pack(*(values[f] for f in FIELDS))


def parse(raw):
    """The fields of one header (a dict)."""
    return dict(zip(FIELDS, HEADER.unpack(raw[:HEADER.size])))


def field_max(name):
    """The largest value field `name` holds (unsigned fields; signed ones their max)."""
    fmt = HEADER.format.lstrip("<")[FIELDS.index(name)]
    size = struct.calcsize(fmt)
    return (1 << (8 * size - (1 if fmt.islower() else 0))) - 1


def field_min(name):
    fmt = HEADER.format.lstrip("<")[FIELDS.index(name)]
    return -(1 << (8 * struct.calcsize(fmt) - 1)) if fmt.islower() else 0


def record_len(payload_len):
    """Bytes of a ring record: header slot and payload, padded to 64."""
    return (SLOT + payload_len + 63) & ~63


class FrameReader:
    """Reassembles the frames an engine writes to a TCP socket (blocking reads)."""

    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def read(self, timeout):
        """The next (header fields, payload)."""
        self.sock.settimeout(timeout)
        while len(self.buf) < HEADER.size:
            self._more()
        h = parse(self.buf)
        plen = h["nbytes"] if h["opcode"] in (OPCODES["EAGER"], OPCODES["DATA"],
                                              OPCODES["ABORT"]) else 0
        while len(self.buf) < HEADER.size + plen:
            self._more()
        payload = self.buf[HEADER.size:HEADER.size + plen]
        self.buf = self.buf[HEADER.size + plen:]
        return h, payload

    def _more(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise EOFError("the engine closed the connection")
        self.buf += chunk
