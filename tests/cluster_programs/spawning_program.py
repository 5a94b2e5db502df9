"""A TF_CONFIG program without TensorFlow for the launcher's clean-up tests: every task
starts a child (`sleep`) and writes "<task> <pid>" and "<task>_child <pid>" lines to
DIR/pids. ps and worker tasks then wait forever; the chief prints 300 numbered lines and
exits at once, leaving its child behind, or with --hold waits forever too.

Usage: spawning_program.py DIR [--hold]"""

import json
import os
import subprocess
import sys
import time


def main():
    directory, hold = sys.argv[1], "--hold" in sys.argv[2:]
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    name = f"{task['type']}_{task['index']}"
    child = subprocess.Popen(["sleep", "300"])
    with open(os.path.join(directory, "pids"), "a") as f:
        f.write(f"{name} {os.getpid()}\n{name}_child {child.pid}\n")
    if task["type"] != "chief" or hold:
        time.sleep(300)
    for i in range(300):
        print(f"line {i}")
    sys.stdout.flush()
    os._exit(0)  # leaves the sleep child running in the task's session


if __name__ == "__main__":
    main()
