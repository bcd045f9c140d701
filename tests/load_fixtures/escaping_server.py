"""A server whose working process hides from a process-group kill, for the cleanup tests.

    python escaping_server.py HOW RECORD [WORKER ARGV...]

The worker (WORKER ARGV, or a sleep that never answers when none is given) writes "PID STARTTIME"
to RECORD (whole: a temp file, then a rename) and then runs in place of itself (exec keeps the
pid). HOW says where the worker runs:

- serve: right here (for a wrapper around it: `sh -c "... serve RECORD ... & wait"`);
- setsid: in a child that calls setsid() first (another session and process group), waited for;
- daemon: a double fork: the child calls setsid(), forks the worker and exits, so the worker's
  parent is gone and it sits in another session; this process then waits forever.

STARTTIME (field 22 of /proc/PID/stat) tells a later reader whether PID is still this worker or a
reused number. Stdlib only.
"""

from __future__ import annotations

import os
import sys
import time

SLEEP = [sys.executable, "-c", "import time; time.sleep(1000)"]


def starttime(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[19]


def work(record: str, argv: list[str]) -> None:
    pid = os.getpid()
    with open(record + ".tmp", "w") as f:
        f.write(f"{pid} {starttime(pid)}")
    os.rename(record + ".tmp", record)
    os.execv(argv[0], argv)


def main(how: str, record: str, argv: list[str]) -> None:
    argv = argv or SLEEP
    if how == "serve":
        work(record, argv)
    if how == "setsid":
        if os.fork() == 0:
            os.setsid()
            work(record, argv)
        os.wait()
        return
    if how == "daemon":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                work(record, argv)
            os._exit(0)
        os.wait()
        time.sleep(1000)
        return
    sys.exit(f"unknown HOW {how!r}: serve, setsid or daemon")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
