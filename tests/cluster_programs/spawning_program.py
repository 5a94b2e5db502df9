"""A TF_CONFIG program without TensorFlow for the launcher's clean-up tests: every task
starts a child (`sleep`) and writes "<task> <pid>" and "<task>_child <pid>" lines to the
FIFO PIPE. ps and worker tasks then wait for a signal (the launcher's); the chief prints
300 numbered lines and exits at once, leaving its child behind, or with --hold waits too.

Usage: spawning_program.py PIPE [--hold]"""

import json
import os
import signal
import subprocess
import sys


def main():
    pipe, hold = sys.argv[1], "--hold" in sys.argv[2:]
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    name = f"{task['type']}_{task['index']}"
    child = subprocess.Popen(["sleep", "300"])
    with open(pipe, "w") as f:  # one short write: atomic on a FIFO
        f.write(f"{name} {os.getpid()}\n{name}_child {child.pid}\n")
    if task["type"] != "chief" or hold:
        signal.pause()  # until the launcher stops the task
    for i in range(300):
        print(f"line {i}")
    sys.stdout.flush()
    os._exit(0)  # leaves the sleep child running in the task's session


if __name__ == "__main__":
    main()
