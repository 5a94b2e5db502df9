"""Several hosts on one machine, for tests and benchmarks: a cluster whose tasks each run on
a host of their own, as on separate machines.

    python -m tests.hosts --shared DIR [--num_workers 2] [--num_ps 2] [--evaluator] -- \\
        [tfps-launch flags] SCRIPT [ARGS...]

Each host is a network namespace with an address of its own on a private network
(SUBNET.0/24, joined by a bridge in a namespace of its own: no link of the machine's own
namespace changes), a /tmp of its own (a mount namespace in which a directory of the run
is bind-mounted over /tmp) and the shared directory DIR at its own path on every host
(bind-mounted into the private /tmp when DIR is under /tmp). The rest of the machine's
files are the same on every host: the repository and Python must not live under /tmp.
tfps-launch runs in the bridge's namespace, where it reaches every host (its health
checks call each task's server), and starts each task on its host through
`tfps-launch --hosts` with a TF_CONFIG naming the hosts' addresses, every server on port
PORT. The harness exits with the launcher's exit code.

Everything is removed when the harness ends, also when it is killed (SIGKILL included):
a watchdog (tests/hosts_cleanup.py), in a session of its own, waits on a pipe from the
harness and, when it closes, kills every process in the run's namespaces, deletes them
(and so their links) and removes the run's directory (the hosts' /tmp). Namespaces are
named tfps-hosts-<run id>-<host>. Needs root; `unavailable()` says why hosts cannot be
made.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid

from tests import hosts_cleanup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A private range no interface of this machine uses (its eth0 is on 192.0.2.0/24): an
# address that collides with one of the machine's would be answered by the machine.
SUBNET = "10.213.77"
SWITCH_ADDRESS = f"{SUBNET}.1"  # the launcher's, on the bridge
PORT = 2222
# Run on each host before its program: its own /tmp, with the shared directory in it.
HOST_SCRIPT = r"""
set -e
private=$1 shared=$2
shift 2
case "$shared" in
  /tmp/*) mkdir -p "$private${shared#/tmp}"; mount --bind "$shared" "$private${shared#/tmp}" ;;
esac
mount --rbind "$private" /tmp
export TMPDIR=/tmp
exec "$@"
"""


def unavailable():
    """Why hosts cannot be made on this machine, or None."""
    if os.geteuid() != 0:
        return "making hosts needs root (ip netns add, mount), and this process is not root"
    missing = [tool for tool in ("ip", "mount", "sh") if shutil.which(tool) is None]
    return f"making hosts needs {', '.join(missing)}, not found" if missing else None


def skip_without_hosts():
    """A mark that skips a test needing hosts where they cannot be made, saying why, except
    where TFPS_REQUIRE_TOOLS=1 (the README test command, which CI runs as root): there the
    run fails instead of passing without them."""
    import pytest
    why = unavailable()
    if why is not None and os.environ.get("TFPS_REQUIRE_TOOLS") == "1":
        raise RuntimeError(f"TFPS_REQUIRE_TOOLS=1 but {why}")
    return pytest.mark.skipif(why is not None, reason=f"no hosts here: {why}")


def _ip(*args):
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"tests/hosts.py: `ip {' '.join(args)}` failed: {out.stderr.strip()}")


class Hosts:
    """Hosts named `names` (a task's host by its name, e.g. "ps_1"), sharing `shared`;
    made on entering, removed on leaving (or by the watchdog, if this process dies)."""

    def __init__(self, names, shared):
        self.names, self.shared = list(names), os.path.abspath(shared)
        if len(self.names) > 200:
            raise ValueError(f"tests/hosts.py: at most 200 hosts, got {len(self.names)}")
        self.run_id = self.dir = None

    @classmethod
    def for_cluster(cls, num_workers, num_ps, shared, evaluator=False):
        """A host per task of a cluster: chief_0, worker_<i>, ps_<i> (and evaluator_0)."""
        names = ["chief_0"] + [f"worker_{i}" for i in range(num_workers)] + [f"ps_{i}" for i in range(num_ps)]
        return cls(names + (["evaluator_0"] if evaluator else []), shared)

    def namespace(self, name):
        return f"{hosts_cleanup.NAMESPACE_PREFIX}{self.run_id}-{name}"

    def address(self, name):
        """The host's address (no port)."""
        return f"{SUBNET}.{10 + self.names.index(name)}"

    def private_dir(self, name):
        """The directory that is the host's /tmp, as the machine sees it."""
        return os.path.join(self.dir, name)

    def __enter__(self):
        reason = unavailable()
        if reason:
            raise RuntimeError(f"tests/hosts.py: {reason}")
        if not os.path.isdir(self.shared) or self.shared == "/tmp":
            raise ValueError(f"tests/hosts.py: the shared directory must be a directory other than /tmp, "
                             f"got {self.shared}")
        hosts_cleanup.sweep_orphans()
        self.run_id = uuid.uuid4().hex[:8]
        self.dir = hosts_cleanup.run_dir(self.run_id)
        os.makedirs(self.dir)
        # The watchdog first, with its pid file: whatever is made after it is removed.
        read, self._pipe = os.pipe()
        self.watchdog = subprocess.Popen([sys.executable, hosts_cleanup.__file__, self.run_id], stdin=read,
                                         stdout=subprocess.DEVNULL, start_new_session=True)
        os.close(read)
        with open(os.path.join(self.dir, hosts_cleanup.WATCHDOG_PID_FILE), "w") as f:
            f.write(str(self.watchdog.pid))
        try:
            self._make_network()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _make_network(self):
        switch = self.namespace("switch")
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "addr", "add", f"{SWITCH_ADDRESS}/24", "dev", "br0")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            namespace = self.namespace(name)
            _ip("netns", "add", namespace)
            # Made in the switch's namespace, one end moved straight to the host's.
            _ip("-n", switch, "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("-n", switch, "link", "set", f"h{i}", "master", "br0", "up")
            _ip("-n", namespace, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            os.makedirs(self.private_dir(name))

    def __exit__(self, *exc):
        """Closes the watchdog's pipe and waits for its clean-up."""
        os.close(self._pipe)
        self.watchdog.wait()

    def exec_prefix(self, name):
        """The command prefix that runs a program on host `name`."""
        return ["ip", "netns", "exec", self.namespace(name), "sh", "-c", HOST_SCRIPT, "tfps-host",
                self.private_dir(name), self.shared]

    def hosts_file(self):
        """Writes tfps-launch's --hosts file for a host per task (named <type>_<index>) and
        returns its path."""
        tasks = {}
        for name in self.names:
            task_type, index = name.rsplit("_", 1)
            tasks.setdefault(task_type, []).append((int(index), {
                "address": f"{self.address(name)}:{PORT}", "exec": self.exec_prefix(name)}))
        path = os.path.join(self.dir, "hosts.json")
        with open(path, "w") as f:
            json.dump({t: [entry for _, entry in sorted(entries)] for t, entries in tasks.items()}, f, indent=1)
        return path

    def environment(self, env=None):
        """`env` (default: this process's) with the repository importable, and the run's id
        in TFPS_HOSTS_RUN, which every process of the run inherits."""
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
        env["TFPS_HOSTS_RUN"] = self.run_id
        return env

    def launch_command(self, arguments):
        """The command that runs tfps-launch with `arguments` (its flags, the script and the
        script's arguments) in the bridge's namespace, its tasks on these hosts."""
        return ["ip", "netns", "exec", self.namespace("switch"), sys.executable, "-m", "tfps.launch",
                "--hosts", self.hosts_file(), *arguments]

    def launch(self, arguments, env=None, **popen):
        """Starts tfps-launch with `arguments` on these hosts; returns its Popen."""
        return subprocess.Popen(self.launch_command(arguments), env=self.environment(env),
                                cwd=popen.pop("cwd", ROOT), **popen)

    def pids(self, name):
        """The pids of every process on host `name`."""
        return hosts_cleanup.processes_in(self.namespace(name))

    def set_link(self, name, up):
        """Brings host `name`'s link up or down at the bridge (its veth's end in the switch's
        namespace): down, the host is cut off from every other host, its processes running on."""
        _ip("-n", self.namespace("switch"), "link", "set", f"h{self.names.index(name)}", "up" if up else "down")

    def kill_host(self, name, sig=signal.SIGKILL):
        """Sends `sig` to every process on host `name`; returns their pids."""
        pids = self.pids(name)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.hosts", description=__doc__.splitlines()[0])
    parser.add_argument("--shared", required=True, help="the directory every host sees at its path")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--num_ps", type=int, default=2)
    parser.add_argument("--evaluator", action="store_true", help="a host for tfps-launch --evaluator too")
    parser.add_argument("launch", nargs="+", metavar="-- ...", help="after --: tfps-launch's flags, SCRIPT "
                                                                      "and its ARGS")
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        parser.error("put -- before tfps-launch's flags, the script and its arguments")
    args = parser.parse_args(argv)  # all after the first -- goes to tfps-launch
    reason = unavailable()
    if reason:
        raise SystemExit(f"tests/hosts.py: {reason}")
    # SIGTERM leaves through the context, which waits for the clean-up (SIGKILL leaves it
    # to the watchdog alone).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with Hosts.for_cluster(args.num_workers, args.num_ps, args.shared, args.evaluator) as hosts:
        print(f"hosts: run {hosts.run_id}, watchdog pid {hosts.watchdog.pid}, addresses "
              f"{json.dumps({name: hosts.address(name) for name in hosts.names})}", file=sys.stderr, flush=True)
        flags = (["--evaluator"] if args.evaluator and "--evaluator" not in args.launch else []) + args.launch
        return hosts.launch(flags, cwd=os.getcwd()).wait()


if __name__ == "__main__":
    sys.exit(main())
