"""The clean-up of tests/hosts.py's hosts: kills every process in a run's network
namespaces, deletes the namespaces (and with them every link in them) and removes the run's
directory. Standard library only, so that it runs as the watchdog of a harness:

    python tests/hosts_cleanup.py RUN_ID < PIPE

waits until PIPE ends (the harness closed it, or the harness died, SIGKILL included: the
kernel closes a dead process's end of the pipe), then cleans the run up. The harness starts
it in a session of its own, so a signal to the harness's process group does not reach it.
The mounts a host makes live in that host's own mount namespace and end with its last
process; the only mounts in the machine's own namespace are the namespaces' files in
/run/netns, which `ip netns delete` removes.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

NAMESPACE_PREFIX = "tfps-hosts-"
RUN_NAMESPACE = re.compile(r"tfps-hosts-([0-9a-f]{8})-")
RUN_DIR_PREFIX = "/tmp/tfps-hosts-"
WATCHDOG_PID_FILE = "watchdog.pid"


def namespaces(run_id):
    """The network namespaces of run `run_id`: tfps-hosts-<run id>-<host>."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in listed.splitlines() if line.strip()]
    return [name for name in names if name.startswith(f"{NAMESPACE_PREFIX}{run_id}-")]


def processes_in(namespace):
    """Pids of the live processes whose network namespace is `namespace`."""
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    return {int(pid) for pid in listed.split()}


def run_dir(run_id):
    return RUN_DIR_PREFIX + run_id


def cleanup(run_id, attempts=100):
    """Kills the run's processes (again, while any forked meanwhile are left), deletes its
    namespaces and removes its directory; returns the pids it killed."""
    killed = set()
    for _ in range(attempts):
        pids = set().union(*(processes_in(name) for name in namespaces(run_id)))
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)  # a stopped process too
            except ProcessLookupError:
                pass
        killed |= pids
        # Until they are gone (a killed process leaves its namespace when reaped), briefly.
        deadline = time.monotonic() + 1.0
        while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)
    for name in namespaces(run_id):
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    shutil.rmtree(run_dir(run_id), ignore_errors=True)
    return killed


def watchdog_alive(run_id):
    """Whether the watchdog of run `run_id` still runs (its pid file names a live process
    whose command line names the run)."""
    try:
        with open(os.path.join(run_dir(run_id), WATCHDOG_PID_FILE)) as f:
            pid = int(f.read())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return run_id.encode() in f.read()
    except (OSError, ValueError):
        return False


def sweep_orphans():
    """Cleans up every run whose watchdog is gone (killed itself, or a machine restarted
    mid-run): its namespaces would otherwise stay. Returns the run ids it cleaned."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    runs = {match.group(1) for match in map(RUN_NAMESPACE.match, listed.splitlines()) if match}
    orphans = sorted(run for run in runs if not watchdog_alive(run))
    for run in orphans:
        cleanup(run)
    return orphans


def main():
    run_id = sys.argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the harness
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):  # nothing is written: this waits for the end
        pass
    cleanup(run_id)


if __name__ == "__main__":
    main()
