"""The remote end of --ssh-cmd: start one rank on this host and stay its parent.

Run as ``CMD HOST python -m commrt.launcher.remote``.  It reads one JSON line
from stdin (argv, environment, working directory, job secret: never on a
command line), writes the secret to a private file, starts the rank in its
own process group, then keeps watching stdin: EOF means the launcher or its
connection is gone, and the rank is killed, so no rank outlives its job.
SIGTERM, SIGINT and SIGHUP are forwarded to the rank's group.  It exits with
the rank's exit code, or dies by the rank's signal.
"""
import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys

from commrt.launcher.binding import BindError, core_block
from commrt.launcher.rankenv import with_defaults
from commrt.launcher.signals import FORWARDED as _FORWARDED, signal_group

_PR_SET_PDEATHSIG = 1
_SPEC_LIMIT = 1 << 20
_SPEC_TIMEOUT_S = 30.0


def read_spec(stdin_fd):
    """One JSON line from stdin, bounded in size and time."""
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(stdin_fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            if not sel.select(_SPEC_TIMEOUT_S):
                raise SystemExit("commrt.launcher.remote: no job spec on stdin within "
                                 f"{_SPEC_TIMEOUT_S:g} s")
            chunk = os.read(stdin_fd, 65536)
            if not chunk:
                raise SystemExit("commrt.launcher.remote: stdin closed before the job spec")
            buf += chunk
            if len(buf) > _SPEC_LIMIT:
                raise SystemExit("commrt.launcher.remote: job spec too large")
    return json.loads(buf.split(b"\n", 1)[0])


def start_rank(spec, secret_fd):
    env = dict(os.environ)
    env.update(spec["env"])
    env["COMMRT_SECRET_FD"] = str(secret_fd)
    env.pop("COMMRT_SECRET", None)
    env.pop("COMMRT_SECRET_FILE", None)
    cores = len(os.sched_getaffinity(0))
    with_defaults(env, max(1, cores // max(1, int(spec.get("local_size", 1)))))
    cwd = spec.get("cwd")
    if not (cwd and os.path.isdir(cwd)):
        cwd = None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()
    block = None
    if spec.get("bind_to") == "core":     # BindError: the shim says so and exits 1
        block = core_block(int(spec.get("local_rank", 0)), int(spec.get("local_size", 1)))

    def child_setup():
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
        if block:
            os.sched_setaffinity(0, block)

    return subprocess.Popen(spec["argv"], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=child_setup,
                            pass_fds=(secret_fd,))


def watch(proc, stdin_fd):
    """Wait for the rank; forward signals; kill it if stdin reaches EOF."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    for sig in _FORWARDED + (signal.SIGCHLD,):
        signal.signal(sig, lambda *_: None)
    with selectors.DefaultSelector() as sel:
        sel.register(wake_r, selectors.EVENT_READ, "signal")
        sel.register(stdin_fd, selectors.EVENT_READ, "stdin")
        while proc.poll() is None:
            for key, _ in sel.select(1.0):
                if key.data == "signal":
                    for signum in os.read(wake_r, 256):
                        if signum in _FORWARDED:
                            signal_group(proc.pid, signum)
                elif not os.read(stdin_fd, 4096):  # the launcher is gone
                    sel.unregister(stdin_fd)
                    signal_group(proc.pid, signal.SIGKILL)
    signal_group(proc.pid, signal.SIGKILL)  # anything the rank left behind
    return proc.returncode


def main():
    stdin_fd = sys.stdin.fileno()
    spec = read_spec(stdin_fd)
    from commrt.rendezvous import auth

    # the secret in memory (a memfd the rank inherits), never in a file: nothing
    # is left on this host under any exit, SIGKILL of this shim included
    secret_fd = auth.secret_descriptor(auth.parse_secret(spec["secret"], "the job spec"))
    try:
        try:
            proc = start_rank(spec, secret_fd)
        except OSError as exc:
            print(f"commrt.launcher.remote: cannot start {spec['argv'][0]}: {exc}", file=sys.stderr)
            return 127
        except BindError as exc:
            print(f"commrt.launcher.remote: {exc}", file=sys.stderr)
            return 1
        code = watch(proc, stdin_fd)
    finally:
        os.close(secret_fd)
    if code < 0:  # die the way the rank died, so the launcher sees the signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is to be ignored
    return code


if __name__ == "__main__":
    sys.exit(main())
