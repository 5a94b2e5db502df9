"""Whether the tasks of a launched cluster still answer: tfps-launch's check for a task that
is alive but hung (stopped by SIGSTOP, frozen by its host). A task whose server answers
while its training threads are deadlocked is not seen as hung: the check sees servers and
process states, not progress.

A task's TensorFlow server answers a GetStatus call on its own gRPC threads even while its
training threads are busy, so a call that goes unanswered for long means the process no
longer runs. A server not yet started refuses the connection at once, which is not a hang.
A task without a server (the chief, an evaluator) is judged by its process state: stopped
('T') counts as not answering. Once a task's server has answered, an address that no longer
answers at all counts as not answering too, not as a server yet to start: a host cut off
from the network first lets the calls time out, and then, once the launcher's host has
forgotten its hardware address (about half a minute), fails them at once as unreachable,
which would otherwise reset the task's silence before the default 30 s deadline passed.
"""

import threading
import time

CALL_TIMEOUT_SECONDS = 5.0
_GET_STATUS = "/tensorflow.WorkerService/GetStatus"


def answers(address, timeout=CALL_TIMEOUT_SECONDS):
    """True if the server at `address` answers GetStatus, False if it let the call time
    out, None if nothing listens there (not started yet, or no server)."""
    import grpc  # TensorFlow's own dependency
    channel = grpc.insecure_channel(address)
    try:
        call = channel.unary_unary(_GET_STATUS, request_serializer=lambda m: m,
                                   response_deserializer=lambda b: b)
        call(b"", timeout=timeout)  # GetStatusRequest has no fields: zero bytes
        return True
    except grpc.RpcError as e:
        return False if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else None
    finally:
        channel.close()


def stopped(pid):
    """Whether process `pid` is stopped (SIGSTOP, a debugger): its state in /proc is 'T'."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class HangWatch:
    """Checks every task every `every` seconds in a thread of its own; `hung()` lists the
    tasks that have not answered for `timeout` seconds in a row."""

    def __init__(self, tasks, addresses, timeout, every=5.0):
        self._tasks, self._addresses = tasks, addresses
        self._timeout, self._every = timeout, every
        self._silent_since = {}
        self._answered = set()  # tasks whose server has answered since they (re)started
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._done.wait(self._every):
            for task in self._tasks:
                if task.process is None or task.poll() is not None:
                    continue
                address = self._addresses.get(task.name)
                ok = not stopped(task.process.pid)
                if ok and address is not None:
                    answer = answers(address)
                    with self._lock:
                        if answer:
                            self._answered.add(task.name)
                        ok = answer is True or (answer is None and task.name not in self._answered)
                with self._lock:
                    if ok:
                        self._silent_since.pop(task.name, None)
                    else:
                        self._silent_since.setdefault(task.name, time.monotonic())

    def hung(self):
        """[(task, seconds silent)] of the tasks silent for at least the timeout."""
        now = time.monotonic()
        with self._lock:
            return [(task, now - self._silent_since[task.name]) for task in self._tasks
                    if task.name in self._silent_since and now - self._silent_since[task.name] >= self._timeout]

    def forget(self, task):
        """A task restarted: its silence so far no longer counts."""
        with self._lock:
            self._silent_since.pop(task.name, None)
            self._answered.discard(task.name)

    def close(self):
        self._done.set()
