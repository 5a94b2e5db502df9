"""A FIFO that processes under test write "<name> <value>" lines to, and a test waits on:
wait_for blocks on the pipe (select) until a condition holds or a deadline passes."""

import os
import select
import time


class EventPipe:
    def __init__(self, path, value=str):
        os.mkfifo(path)
        self.path = path
        self._read_end = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        # Held open so the FIFO never reports end-of-file between one writer and the next.
        self._write_end = os.open(path, os.O_WRONLY)
        self._pending = b""
        self._value = value
        self.values = {}  # the last value written under each name

    def wait_for(self, condition, seconds, what, process=None):
        """Blocks until condition(values) holds; fails after `seconds`, or at once if
        `process` (a Popen) has exited."""
        deadline = time.monotonic() + seconds
        while not condition(self.values):
            if process is not None and process.poll() is not None:
                raise AssertionError(f"the process exited ({process.returncode}) before {what}: "
                                     + (process.communicate()[1] or "")[-3000:])
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {what}; seen so far: {self.values}"
            # With a process to watch, wake at least once a second to see whether it died.
            if select.select([self._read_end], [], [], min(left, 1.0) if process else left)[0]:
                self._pending += os.read(self._read_end, 4096)
                *lines, self._pending = self._pending.split(b"\n")
                for line in lines:
                    name, value = line.decode().split(maxsplit=1)
                    self.values[name] = self._value(value)

    def close(self):
        os.close(self._read_end)
        os.close(self._write_end)
