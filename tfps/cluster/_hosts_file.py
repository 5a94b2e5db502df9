"""tfps-launch --hosts FILE: where each task runs, instead of local processes on 127.0.0.1.

The file is JSON, one list per task type, each entry a task in index order:

    {"chief":  [{"address": "10.0.0.10:2222", "exec": ["ip", "netns", "exec", "host0"]}],
     "worker": [{"address": "10.0.0.11:2222", "exec": [...]}, ...],
     "ps":     [{"address": "10.0.0.13:2222", "exec": [...]}, ...],
     "evaluator": [{"exec": [...]}]}

"address" is the task's entry in the cluster spec of every task's TF_CONFIG (host:port, as
the other tasks reach it; the launcher's health checks call it there too); "exec" (optional)
is a command prefix that runs the task's program on its host with the environment it is
given (tests/hosts.py's hosts use `ip netns exec`). An evaluator has no address.
"""

import json

TASK_TYPES = ("chief", "worker", "ps", "evaluator")


def read_hosts(path):
    """(cluster spec {type: [address]}, {task name: exec prefix}) from a --hosts file;
    SystemExit naming the file and the fault when it is not one."""
    def refuse(why):
        raise SystemExit(f"tfps-launch: --hosts {path}: {why}")
    try:
        with open(path) as f:
            hosts = json.load(f)
    except (OSError, ValueError) as e:
        refuse(f"cannot read it as JSON ({e})")
    if not isinstance(hosts, dict) or set(hosts) - set(TASK_TYPES):
        refuse(f"must be a JSON object whose keys are among {', '.join(TASK_TYPES)}")
    counts = {t: len(hosts.get(t) or []) for t in TASK_TYPES}
    if counts["chief"] != 1 or counts["worker"] < 1 or counts["ps"] < 1 or counts["evaluator"] > 1:
        refuse(f"needs one chief, at least one worker and one ps, at most one evaluator; got {counts}")
    cluster, prefixes = {}, {}
    for task_type in TASK_TYPES:
        for index, entry in enumerate(hosts.get(task_type) or []):
            name = f"{task_type}_{index}"
            if not isinstance(entry, dict):
                refuse(f"{name} must be an object with \"address\" and \"exec\"")
            prefix = entry.get("exec", [])
            if not isinstance(prefix, list) or not all(isinstance(p, str) for p in prefix):
                refuse(f"{name}'s \"exec\" must be a list of strings, got {prefix!r}")
            prefixes[name] = prefix
            if task_type == "evaluator":
                continue
            address = entry.get("address")
            if not isinstance(address, str) or ":" not in address:
                refuse(f"{name} needs an \"address\" host:port, got {address!r}")
            cluster.setdefault(task_type, []).append(address)
    return cluster, prefixes
