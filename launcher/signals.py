"""Signalling a rank's process group, shared by the launcher, its elastic driver
and the remote end of --ssh-cmd.

A rank stopped by SIGSTOP (a debugger, Ctrl-Z, a fault test) keeps any
catchable signal pending until it runs again, so SIGTERM alone would leave it
standing until the grace period ends in SIGKILL.  Like a shell's ``kill`` and
systemd's stop, each catchable signal is followed by SIGCONT: a stopped rank
then receives it at once, and a running one ignores the SIGCONT.
"""
import os
import signal

# the signals the launcher passes on to every rank's group
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT)


def signal_group(pgid, signum):
    """Send signum to process group pgid (gone or not ours: nothing), then
    SIGCONT where signum is one a stopped process would hold pending."""
    try:
        os.killpg(pgid, signum)
        if signum not in _UNCATCHABLE:
            os.killpg(pgid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        pass
