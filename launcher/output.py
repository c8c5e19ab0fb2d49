"""Forward the ranks' output: whole lines only, each prefixed ``[k] ``.

Each (rank, stream) has its own buffer; a read from a rank's pipe may end
mid-line, so only complete lines leave the buffer, in one write, and the
rest waits for its newline (or for EOF, when it is flushed with one).  The
launcher is the only writer of its stdout and stderr, so lines of different
ranks can never interleave mid-line.  A line longer than MAX_LINE_BYTES is
cut there rather than held without bound.

Tags: ``[k] `` by default; mpirun's ``[1,k]<stdout>:`` with tag="mpirun";
none with prefix=False; timestamps=True puts the time each read arrived
before the tag.  Files: log_dir/rank.K.log (both streams) and mpirun's
output_dir/1/rank.K/stdout and .../stderr, unprefixed.
"""
import collections
import datetime
import os
import re
import time

MAX_LINE_BYTES = 4 << 20
TAIL_LINES = 20
STDOUT, STDERR = 0, 1


_SEGMENT = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r)")


class OutputRouter:
    """Routes bytes read from the ranks' pipes to our stdout/stderr and log files."""

    def __init__(self, prefix=True, log_dir=None, out=None, err=None, *, tag="rank",
                 timestamps=False, output_dir=None, to_terminal=True, append=False):
        import sys
        self.prefix = prefix
        self.tag = tag
        self.timestamps = timestamps
        self.log_dir = log_dir
        self.output_dir = output_dir
        self.to_terminal = to_terminal
        self._mode = "ab" if append else "wb"     # a restarted job adds to the files
        self._files = {}            # (rank, stream) -> file under output_dir
        self._sinks = [out or sys.stdout.buffer, err or sys.stderr.buffer]
        self._broken = [False, False]
        self._buffers = {}
        self._logs = {}
        self._tails = collections.defaultdict(lambda: collections.deque(maxlen=TAIL_LINES))
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        if output_dir:
            os.makedirs(os.path.join(output_dir, "1"), exist_ok=True)

    def add_rank(self, rank):
        self._buffers[(rank, STDOUT)] = bytearray()
        self._buffers[(rank, STDERR)] = bytearray()
        if self.log_dir:
            self._logs[rank] = open(os.path.join(self.log_dir, f"rank.{rank}.log"), self._mode)
        if self.output_dir:
            where = os.path.join(self.output_dir, "1", f"rank.{rank}")
            os.makedirs(where, exist_ok=True)
            for stream, name in ((STDOUT, "stdout"), (STDERR, "stderr")):
                self._files[(rank, stream)] = open(os.path.join(where, name), self._mode)

    def feed(self, rank, stream, data):
        """Take bytes read from one pipe; emit every complete line."""
        buf = self._buffers[(rank, stream)]
        buf += data
        # a carriage return ends a segment too: progress bars (tqdm) redraw
        # their line with it, and should be seen as they move
        end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        if end and buf[end - 1:end] == b"\r" and end == len(buf):
            end -= 1                 # maybe the first half of \r\n: wait for the next byte
            end = max(buf.rfind(b"\n", 0, end), buf.rfind(b"\r", 0, end)) + 1
        if end == 0 and len(buf) >= MAX_LINE_BYTES:
            buf += b"\n"  # an endless line: cut it rather than hold it all
            end = len(buf)
        if end:
            lines = bytes(buf[:end])
            del buf[:end]
            self._emit(rank, stream, lines)

    def finish(self, rank, stream):
        """The pipe reached EOF: flush a last partial line, with a newline."""
        buf = self._buffers[(rank, stream)]
        if buf:
            lines = bytes(buf) + b"\n"
            buf.clear()
            self._emit(rank, stream, lines)

    def tail(self, rank):
        """The last lines rank ``rank`` wrote to stderr."""
        return list(self._tails[rank])

    def close(self):
        for f in list(self._logs.values()) + list(self._files.values()):
            f.close()
        self._logs.clear()
        self._files.clear()

    def _emit(self, rank, stream, lines):
        # segments, each with its terminator: \n, \r\n or a lone \r (a redrawn line)
        segments = _SEGMENT.findall(lines)
        if stream == STDERR:
            self._tails[rank].extend(seg.rstrip(b"\r\n").decode("utf-8", "replace")
                                     for seg in segments if seg.endswith(b"\n"))
        log = self._logs.get(rank)
        if log is not None:
            log.write(lines)
            log.flush()
        per_stream = self._files.get((rank, stream))
        if per_stream is not None:
            per_stream.write(lines)
            per_stream.flush()
        if not self.to_terminal:
            return
        tag = self._tag(rank, stream)
        if tag:
            lines = b"".join(tag + seg for seg in segments)
        self._write(stream, lines)

    def _tag(self, rank, stream):
        tag = b""
        if self.prefix:
            tag = (b"[1,%d]<%s>:" % (rank, b"stdout" if stream == STDOUT else b"stderr")
                   if self.tag == "mpirun" else b"[%d] " % rank)
        if self.timestamps:
            now = datetime.datetime.now().isoformat(sep=" ", timespec="microseconds")
            tag = now.encode() + b" " + tag
        return tag

    def _write(self, stream, data):
        if self._broken[stream]:
            return
        sink = self._sinks[stream]
        try:
            # Under PYTHONUNBUFFERED our stdout is a raw file: a write into a
            # full pipe that a signal (a rank's SIGCHLD) interrupts returns a
            # partial count, and the rest must be written, not dropped.
            view = memoryview(data)
            while view:
                n = sink.write(view)
                if n is None:                   # a non-blocking sink that is full
                    time.sleep(0.001)
                    continue
                view = view[n:]
            sink.flush()
        except BrokenPipeError:  # e.g. `commrt-launch ... | head`: drop the rest
            self._broken[stream] = True
