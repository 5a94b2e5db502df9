"""What each parameter server of a tfps-launch cluster sends and receives while a program
trains: bytes from the kernel's TCP counters of the PS process's sockets (all of its
traffic, gRPC framing included), and remote calls from TensorFlow's own RPC log lines;
and the CPU time each task's process uses, which this machine's noise does not inflate
the way it does wall time.

A call is one of: a component function the worker runs on the PS (one per PS per
execution of a multi-device function), or one RecvTensor RPC that moves a tensor between
the PS and another task (the receiver asks for it). TensorFlow logs both when the tasks
run with RPC_LOG_ENV; the counts read the lines whose timestamps fall in the window.
"""

import os
import re
import subprocess

# Passed to every task of the cluster, so their logs name each call.
RPC_LOG_ENV = {"TF_CPP_MIN_LOG_LEVEL": "0",
               "TF_CPP_VMODULE": "grpc_remote_worker=1,process_function_library_runtime=1"}

_PID = re.compile(r"pid=(\d+)")
_TIMESTAMP = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:(\d+\.\d+)\s")
_COMPONENT = re.compile(r"Running component function on device /job:ps/replica:0/task:(\d+)/")
_RENDEZVOUS = re.compile(r'rendezvous_key: "([^;]+);[^;]*;([^;]+);([^;]+);')
_PS_TASK = re.compile(r"^/job:ps/replica:0/task:(\d+)/")


def _ss(*args):
    out = subprocess.run(["ss", "-H", *args], capture_output=True, text=True, check=True)
    return out.stdout


def listening_pid(port):
    """The pid of the process listening on TCP `port` of this machine."""
    pids = set(_PID.findall(_ss("-tlnp", f"sport = :{port}")))
    if len(pids) != 1:
        raise RuntimeError(f"expected one process listening on port {port}, found pids {sorted(pids)}")
    return int(pids.pop())


def socket_bytes(pid):
    """{(local address, peer address): (bytes sent, bytes received)} of every TCP socket
    process `pid` holds now."""
    sockets = {}
    owner = address = None
    for line in _ss("-tinp").splitlines():
        if not line.startswith(("\t", " ")):  # a socket's line; its TCP counters follow
            words = line.split()
            owner = {int(p) for p in _PID.findall(line)}
            address = (words[3], words[4]) if len(words) > 4 else None
            continue
        if owner is not None and pid in owner and address is not None:
            fields = dict(f.split(":", 1) for f in line.split() if ":" in f and "(" not in f)
            # ss leaves out counters that are 0
            sockets[address] = (int(fields.get("bytes_sent", 0)), int(fields.get("bytes_received", 0)))
    return sockets


def bytes_between(before, after):
    """(bytes sent, bytes received) between two socket_bytes snapshots: each socket open at
    the end counts from its figure at the start (0 if it opened since). A socket closed
    in between is not counted; gRPC keeps its connections for the life of the cluster."""
    sent = received = 0
    for address, (end_sent, end_received) in after.items():
        start_sent, start_received = before.get(address, (0, 0))
        sent += end_sent - start_sent
        received += end_received - start_received
    return sent, received


def cpu_seconds(pid):
    """User plus system CPU time process `pid` has used so far (all of its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_calls(log_path, start, end):
    """({ps task index: calls}, stamped lines read in the window) in one task's log
    (tfps-launch's <type>_<index>.log) between `start` and `end` (epoch seconds):
    component functions this task started on another task's PS device, and RecvTensor
    RPCs this task issued to or for a PS (the tensor's source or destination is that PS;
    one between two PS counts for the one it goes to)."""
    name = os.path.basename(log_path)
    own_ps = int(name[len("ps_"):-len(".log")]) if name.startswith("ps_") else None
    calls = {}
    in_window = False
    stamped = 0
    with open(log_path, errors="replace") as log:
        for line in log:
            stamp = _TIMESTAMP.match(line)
            if stamp:
                seconds = float(stamp.group(1))
                if seconds < 1e9:  # not an epoch time: the log's format is not the one read here
                    raise ValueError(f"{log_path}: a line stamped {seconds}, not in epoch seconds: {line[:80]!r}")
                in_window = start <= seconds <= end
                stamped += in_window
                component = _COMPONENT.search(line) if in_window else None
                if component and int(component.group(1)) != own_ps:  # its own are local
                    task = int(component.group(1))
                    calls[task] = calls.get(task, 0) + 1
                continue
            key = _RENDEZVOUS.search(line) if in_window else None
            if key:
                source, destination = _PS_TASK.match(key.group(1)), _PS_TASK.match(key.group(2))
                ps = destination or source
                if ps:
                    calls[int(ps.group(1))] = calls.get(int(ps.group(1)), 0) + 1
    return calls, stamped


def calls_per_ps(log_dir, start, end):
    """{ps task index: calls} over every task log tfps-launch wrote in `log_dir`."""
    total = {}
    stamped = 0
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".log") and name != "launcher.log":
            calls, lines = count_calls(os.path.join(log_dir, name), start, end)
            stamped += lines
            for task, count in calls.items():
                total[task] = total.get(task, 0) + count
    if not stamped or not total:
        raise ValueError(f"no RPC log lines between {start} and {end} in {log_dir}: did the tasks run "
                         f"with {RPC_LOG_ENV}?")
    return total
