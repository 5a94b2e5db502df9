"""Fault injection: the main job (examples/train_ctr.py, asynchronous or with --sync) and
the streaming example (examples/stream_ctr.py) under tfps-launch, with one task killed per
round at a random moment, as users run them.

    python benchmarks/faults.py --rounds 20                 # random kinds, jobs alternating
    python benchmarks/faults.py --kinds ps,worker,chief,mid_backup,mid_restore,stopped_ps --jobs stream

Kinds: ps, worker, chief (SIGKILL of that task while it trains); mid_backup (SIGKILL of the
chief or a parameter server after a backup's files are written and before chain.json lists
them); mid_restore (a parameter server killed, then, in the restarted cluster, the chief or a
parameter server killed after the whole backup is restored and before its backups of changes);
stopped_ps (SIGSTOP: a hung parameter server, which tfps-launch must find silent and kill);
after_training (SIGKILL of a parameter server after the main job's fit has ended and deleted
its backups, before the final evaluation: the restarted cluster must resume from the last
epoch checkpoint and train no step again). Across hosts (tests/hosts.py: each task on a host
of its own, a network namespace with its own address, the run's directory shared): host_killed
(every process of a parameter server's host SIGKILLed while it trains); host_cut_brief (that
host's link down at the bridge for BRIEF_CUT_SECONDS, well under the launcher's health check
deadline, --hang_timeout HANG_TIMEOUT: training goes on and nothing is restarted); host_cut (a
brief cut first, then, once training has gone on, the link down until the launcher has found
the host's task silent and killed it, and then back: the whole cluster restarts there). The
stream also exports a serving version every 3 s. Each round must end with exit code 0 and the job's last line printed (train_ctr's final
eval, stream_ctr's end of stream), and every serving version the stream wrote must load and
serve; every restore must equal, row by row (keys, values, slots, metadata), the backup it
came from, restored again here into a one-shard table; at most one backup interval (plus one
block of steps) may be lost per restore; a lost parameter server must restart the whole
cluster, with the terminal saying where the chief's errors are (and a stopped one be reported
silent and killed); and no process of the launch may be left. Prints one JSON line per round
and a markdown table; exits 1 if any round failed.
"""

import argparse
import glob
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_KINDS = ("host_killed", "host_cut_brief", "host_cut")
KINDS = ("ps", "worker", "chief", "mid_backup", "mid_restore", "stopped_ps", "after_training") + HOST_KINDS
ROWS_PER_FILE, BATCH, BACKUP_EVERY, STEPS_PER_EXECUTION = 12000, 512, 20, 10
HANG_TIMEOUT = 10  # tfps-launch --hang_timeout: a task silent this long is killed
BRIEF_CUT_SECONDS = 3


class Job:
    """One program the suite runs: its arguments, its epochs (stream_ctr's chunks) and the
    line that says it finished."""

    def __init__(self, name, arguments, epochs, steps_per_epoch, table_layer, finished, kinds=KINDS):
        self.name, self.arguments, self.table_layer, self.finished = name, arguments, table_layer, finished
        self.kinds = kinds  # the fault kinds this job can be given
        self.epochs, self.steps_per_epoch = epochs, steps_per_epoch
        self.path = os.path.join(ROOT, "examples", f"{name}.py")

    def module(self):
        spec = importlib.util.spec_from_file_location(self.name, self.path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def build_model(self):
        """The job's model, made here as its chief makes it."""
        import tensorflow as tf
        module = self.module()
        if self.name == "train_ctr":
            options = module.table_options(module.parse_arguments(self.arguments))
            options["storage"] = None  # a table of this process's own (the tier's are the servers')
            return module.build_model(tf.distribute.get_strategy(), 16, 0.3, **options)
        import tfps
        return module.build_model(tf.distribute.get_strategy(), tfps.stream.DriftingStream(),
                                  module.parse_arguments(self.arguments))


STREAM_CHUNK_STEPS = 40
JOBS = {
    # 3 training files, the 4th evaluates.
    "train": Job("train_ctr", ["--rows_per_file", str(ROWS_PER_FILE), "--epochs", "2"], 2,
                 3 * ROWS_PER_FILE // BATCH, "fields", "eval over"),
    # The same in synchronous steps (SynchronousTraining): each step reads a batch on both workers.
    "train_sync": Job("train_ctr", ["--rows_per_file", str(ROWS_PER_FILE), "--epochs", "2", "--sync"], 2,
                      3 * ROWS_PER_FILE // (2 * BATCH), "fields", "eval over"),
    # Everything on: a worker cache with bfloat16 transfers, admission, TTL eviction, a row
    # cap and a tiered table (a killed parameter server leaves its disk tier's files, which
    # the restarted one wipes), beside the epoch checkpoints and backups every job has.
    "train_all": Job("train_ctr", ["--rows_per_file", str(ROWS_PER_FILE), "--epochs", "2",
                                   "--worker_cache_rows", "20000", "--max_staleness_steps", "2",
                                   "--transfer_dtype", "bfloat16", "--min_count", "2", "--ttl_steps", "40",
                                   "--max_rows", "60000", "--tier_memory_rows", "20000"], 2,
                     3 * ROWS_PER_FILE // BATCH, "fields", "eval over"),
    "stream": Job("stream_ctr", ["--examples", str(6 * STREAM_CHUNK_STEPS * BATCH),
                                 "--chunk", str(STREAM_CHUNK_STEPS * BATCH), "--eval_examples", str(10 * BATCH)],
                  6, STREAM_CHUNK_STEPS, "ids_table", "stream done",
                  kinds=tuple(k for k in KINDS if k != "after_training")),  # one fit to the end
}


def launch_processes(launch_id):
    """{task name: pid} of the live processes of one launch (their TF_CONFIG and
    TFPS_LAUNCH_ID in /proc), each task's first process."""
    found = {}
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(environ, "rb") as f:
                variables = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if variables.get(b"TFPS_LAUNCH_ID", b"").decode() != launch_id or b"TF_CONFIG" not in variables:
            continue
        task = json.loads(variables[b"TF_CONFIG"])["task"]
        pid = int(environ.split("/")[2])
        name = f"{task['type']}_{task['index']}"
        found[name] = min(pid, found.get(name, pid))
    return found


def wait_for(condition, seconds, what, launcher):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        try:  # the launcher's exit ends the wait at once; else look again in 0.2 s
            launcher.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
        raise RuntimeError(f"the launch ended (code {launcher.returncode}) before {what}")
    raise RuntimeError(f"timed out waiting for {what}")


def processes_gone(launch_id, seconds=10.0):
    """The tasks of the launch still alive once they have had `seconds` to exit."""
    deadline = time.monotonic() + seconds
    left = launch_processes(launch_id)
    while left and time.monotonic() < deadline:
        threading.Event().wait(0.1)
        left = launch_processes(launch_id)
    return left


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def kill(launch_id, name, sig=signal.SIGKILL):
    pid = launch_processes(launch_id)[name]
    os.kill(pid, sig)
    return f"{name} ({signal.Signals(sig).name})"


def brief_cut(hosts, name, report, launcher, figures):
    """Cuts host `name` off for BRIEF_CUT_SECONDS, then waits for the next block of steps;
    records in `figures` the steps run during the cut, the seconds from the link's return to
    the next block, and whether the cluster restarted or found a task silent meanwhile."""
    progress = os.path.join(report, "progress-0")
    launcher_log = os.path.join(os.path.dirname(report), "logs", "launcher.log")
    before = read_int(progress) or 0
    hosts.set_link(name, False)
    try:
        threading.Event().wait(BRIEF_CUT_SECONDS)
    finally:
        hosts.set_link(name, True)
    back, at_return = time.monotonic(), read_int(progress) or 0
    wait_for(lambda: (read_int(progress) or 0) > at_return, 300, "a block of steps after the brief cut", launcher)
    figures["brief_cut_steps"] = at_return - before
    figures["brief_cut_next_block_s"] = round(time.monotonic() - back, 1)
    with open(launcher_log) as f:
        said = f.read()
    figures["brief_cut_restarted"] = (os.path.exists(os.path.join(report, "progress-1"))
                                      or "has not answered for" in said or "restarting" in said)


def long_cut(hosts, name, report, launcher, figures):
    """Cuts host `name` off until the launcher has found its task silent for --hang_timeout
    and killed it, then brings it back; records the cut's length in `figures`."""
    launcher_log = os.path.join(os.path.dirname(report), "logs", "launcher.log")

    def found_silent():
        with open(launcher_log) as f:
            return f"{name} has not answered for" in f.read()
    figures["fault_at"] = start = time.monotonic()
    hosts.set_link(name, False)
    try:
        wait_for(found_silent, 300, f"the launcher to find {name} silent", launcher)
    finally:
        hosts.set_link(name, True)
    figures["long_cut_s"] = round(time.monotonic() - start, 1)


def inject(kind, job, rng, launch_id, report, launcher, hosts=None, figures=None):
    """Waits for the moment of `kind`'s fault and causes it (a host kind on `hosts`,
    recording its figures in `figures`); returns (what was done, the task signalled first)."""
    progress = os.path.join(report, "progress-0")
    # A random moment after the first backups: between 1.5 intervals and 2/3 of the steps.
    moment = rng.randint(BACKUP_EVERY + BACKUP_EVERY // 2, 2 * job.epochs * job.steps_per_epoch // 3)
    if kind in HOST_KINDS:
        figures = {} if figures is None else figures
        if kind == "host_cut":  # the brief cut early, so that the long one has steps left after it
            moment = rng.randint(BACKUP_EVERY + BACKUP_EVERY // 2, job.epochs * job.steps_per_epoch // 3)
        wait_for(lambda: (read_int(progress) or 0) >= moment, 600, f"step {moment}", launcher)
        name = f"ps_{rng.randint(0, 1)}"
        if kind == "host_killed":
            figures["fault_at"] = time.monotonic()
            killed = hosts.kill_host(name)
            return f"host {name}'s {len(killed)} process(es) (SIGKILL)", name
        brief_cut(hosts, name, report, launcher, figures)
        if kind == "host_cut_brief":
            return f"host {name} cut off for {BRIEF_CUT_SECONDS} s", name
        # The long cut once training has gone on for two blocks after the brief one.
        further = (read_int(progress) or 0) + 2 * STEPS_PER_EXECUTION
        wait_for(lambda: (read_int(progress) or 0) >= further, 600, f"step {further}", launcher)
        long_cut(hosts, name, report, launcher, figures)
        return (f"host {name} cut off for {BRIEF_CUT_SECONDS} s, then until found silent "
                f"({figures['long_cut_s']} s)"), name
    if kind in ("ps", "worker", "chief", "stopped_ps", "mid_restore"):
        wait_for(lambda: (read_int(progress) or 0) >= moment, 600, f"step {moment}", launcher)
        if kind == "stopped_ps":
            name = f"ps_{rng.randint(0, 1)}"
            return kill(launch_id, name, signal.SIGSTOP), name
        name = {"ps": f"ps_{rng.randint(0, 1)}", "worker": f"worker_{rng.randint(0, 1)}",
                "chief": "chief_0", "mid_restore": f"ps_{rng.randint(0, 1)}"}[kind]
        done = kill(launch_id, name)
        if kind != "mid_restore":
            return done, name
        wait_for(lambda: os.path.exists(os.path.join(report, "holding-restore")), 600,
                 "the restarted cluster's restore", launcher)
        return done + " then, mid-restore, " + kill(launch_id, rng.choice(["chief_0", "ps_0", "ps_1"])), name
    if kind == "after_training":
        wait_for(lambda: os.path.exists(os.path.join(report, "holding-after_training")), 600,
                 "the end of training", launcher)
        name = f"ps_{rng.randint(0, 1)}"
        return "after training " + kill(launch_id, name), name
    wait_for(lambda: os.path.exists(os.path.join(report, "holding-backup")), 600, "the 3rd backup", launcher)
    name = rng.choice(["chief_0", "ps_0", "ps_1"])
    return "mid-backup " + kill(launch_id, name), name


def compare_restores(job, report):
    """Restores each copied backup chain into a one-shard table here and compares its rows
    with those the cluster restored. Returns (rows compared, rows differing, restores)."""
    import numpy as np
    import tensorflow as tf
    compared = differing = restores = 0
    for restored_path in sorted(glob.glob(os.path.join(report, "restored-*.npz"))):
        restart = restored_path.rsplit("-", 1)[1].split(".")[0]
        copy = os.path.join(report, f"restore-{restart}")
        with open(os.path.join(copy, "chain.json")) as f:
            state = json.load(f)
        model = job.build_model()
        # A backup's checkpoint holds the model as "model", an epoch checkpoint as "root".
        checkpoint = tf.train.Checkpoint(**{state.get("checkpoint_root", "model"): model})
        for name in state["chain"]:
            checkpoint.read(os.path.join(copy, name)).expect_partial()
        rows = model.get_layer(job.table_layer).table.export()
        order = np.argsort(rows.keys.numpy())
        mine = {name: getattr(rows, name).numpy()[order] for name in rows._fields}
        theirs = np.load(restored_path)
        restores += 1
        compared += len(theirs["keys"])
        if not np.array_equal(mine["keys"], theirs["keys"]):
            differing += max(len(theirs["keys"]), len(mine["keys"]))
            continue
        same = np.ones(len(theirs["keys"]), bool)
        for field in ("values", "slots", "metadata"):
            same &= (mine[field] == theirs[field]).reshape(len(same), -1).all(axis=1)
        differing += int((~same).sum())
    return compared, differing, restores


def steps_lost(job, report):
    """Per restore: the steps the cluster before it had run minus those the restored backup
    holds (as positions: epoch x steps per epoch + steps of the epoch)."""
    lost = []
    for copy in sorted(glob.glob(os.path.join(report, "restore-*"))):
        restart = int(copy.rsplit("-", 1)[1])
        with open(os.path.join(copy, "chain.json")) as f:
            state = json.load(f)
        batch = job.steps_per_epoch - 1 if state["batch"] < 0 else state["batch"]  # -1: the epoch's end
        saved = state["epoch"] * job.steps_per_epoch + batch + 1
        ran = max(read_int(os.path.join(report, f"progress-{r}")) or 0 for r in range(restart))
        lost.append(ran - saved)
    return lost


def versions_serving(base_dir):
    """(numbered versions under base_dir, how many of them load and serve finite predictions)."""
    import numpy as np
    import tensorflow as tf
    versions = sorted(v for v in os.listdir(base_dir) if v.isdigit()) if os.path.isdir(base_dir) else []
    serving = 0
    for version in versions:
        serve = tf.saved_model.load(os.path.join(base_dir, version)).signatures["serving_default"]
        ids = tf.constant(np.arange(80, dtype=np.int64).reshape(10, 8) * 997)
        serving += bool(np.isfinite(next(iter(serve(ids=ids).values())).numpy()).all())
    return len(versions), serving


class FirstSeen(threading.Thread):
    """Notes when each restarted cluster's first progress record (progress-<restart>)
    appears: its first block of steps after the restore."""

    def __init__(self, report):
        super().__init__(daemon=True)
        self.report, self.seen, self.done = report, {}, threading.Event()
        self.start()

    def run(self):
        while not self.done.wait(0.2):
            for path in glob.glob(os.path.join(self.report, "progress-[1-9]*")):
                self.seen.setdefault(int(path.rsplit("-", 1)[1]), time.monotonic())


def run_round(kind, job, index, rng, work, data_dir):
    if kind not in HOST_KINDS:
        return _run_round(kind, job, index, rng, work, data_dir)
    from tests import hosts as hosts_lib
    from tests import hosts_cleanup
    reason = hosts_lib.unavailable()
    if reason:
        raise RuntimeError(f"the {kind} round runs on tests/hosts.py's hosts, which cannot be made here: {reason}")
    out = os.path.join(work, f"round-{index}")  # every host's shared directory
    os.makedirs(out)
    if job.name == "train_ctr":  # the hosts' /tmp is each one's own: the data goes where all see it
        shutil.copytree(data_dir, os.path.join(out, "data"))
        data_dir = os.path.join(out, "data")
    with hosts_lib.Hosts.for_cluster(2, 2, out) as hosts:
        result = _run_round(kind, job, index, rng, work, data_dir, hosts=hosts)
        run_id = hosts.run_id
    result["namespaces_left"] = hosts_cleanup.namespaces(run_id)
    result["ok"] = result["ok"] and not result["namespaces_left"]
    return result


def _run_round(kind, job, index, rng, work, data_dir, hosts=None):
    launch_id = f"faults-{os.getpid()}-{index}"
    out = os.path.join(work, f"round-{index}")
    report = os.path.join(out, "report")
    flags = ["--max_restarts", "3", "--hang_timeout", str(HANG_TIMEOUT), "--log_dir", os.path.join(out, "logs"),
             job.path, *job.arguments, "--batch_size", str(BATCH), "--out_dir", os.path.join(out, "run"),
             "--backup_every_steps", str(BACKUP_EVERY), "--fault_report", report]
    command = (hosts.launch_command(flags) if hosts else
               [sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "2", *flags])
    if job.name == "train_ctr":
        command += ["--data_dir", data_dir]
    else:  # the stream also keeps a serving model base path fresh, through its restarts
        command += ["--serving_dir", os.path.join(out, "serving"), "--export_every_seconds", "3", "--whole_at_end"]
    if kind in ("mid_backup", "mid_restore"):
        command += ["--fault_hold", kind[4:]]
    if kind == "after_training":
        command += ["--fault_hold", kind]
    env = dict(os.environ, TFPS_LAUNCH_ID=launch_id, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    if hosts:
        env = hosts.environment(env)
    os.makedirs(report, exist_ok=True)
    start = time.monotonic()
    log = open(os.path.join(out, "launcher.out"), "w")
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT)
    result = {"job": job.name, "sync": "--sync" in job.arguments, "kind": kind, "round": index}
    first_seen, figures = FirstSeen(report), {}
    try:
        result["fault"], result["signalled"] = inject(kind, job, rng, launch_id, report, launcher, hosts, figures)
        figures.setdefault("fault_at", time.monotonic())
        stdout, _ = launcher.communicate(timeout=900)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        launcher.kill()
        stdout, _ = launcher.communicate()
        result["error"] = str(e)
    log.close()
    first_seen.done.set()
    first_seen.join()
    result["seconds"] = round(time.monotonic() - start, 1)
    # Time to recover: from the fault to the restarted cluster's first block of steps.
    recovered = [at for at in first_seen.seen.values() if at > figures.get("fault_at", float("inf"))]
    result["recover_s"] = round(min(recovered) - figures["fault_at"], 1) if recovered else None
    result.update((key, value) for key, value in figures.items() if key != "fault_at")
    result["rc"] = launcher.returncode
    result["finished"] = job.finished in (stdout or "")
    # A lost task's errors stay in the chief's log: the terminal shows none of them.
    result["traceback_shown"] = "Traceback" in (stdout or "")
    launcher_log = os.path.join(out, "logs", "launcher.log")
    said = ""
    if os.path.exists(launcher_log):
        with open(launcher_log) as f:
            said = f.read()
    result["reported_hung"] = "has not answered for" in said
    # A lost parameter server restarts the whole cluster, and the terminal (the launcher's
    # stderr) says where the chief's errors about it are, instead of showing them.
    with open(os.path.join(out, "launcher.out")) as f:
        terminal = f.read()
    result["restart_explained"] = ("restarting the whole cluster" in terminal
                                   and "the chief's errors about it are in" in terminal)
    result["left_behind"] = sorted(processes_gone(launch_id))
    result["rows_compared"], result["rows_differing"], result["restores"] = compare_restores(job, report)
    result["steps_lost"] = steps_lost(job, report)
    # Whether a restarted cluster ran a training step: none may when training had ended
    # before the fault.
    result["trained_after_restart"] = bool(glob.glob(os.path.join(report, "progress-[1-9]*")))
    if job.name == "stream_ctr":
        result["versions"], result["versions_serving"] = versions_serving(os.path.join(out, "serving"))
    # A SIGKILLed parameter server is seen to exit, a SIGSTOPped or cut off one found silent
    # (and a briefly cut one not at all).
    hang_found_right = kind not in ("ps", "stopped_ps", "host_killed", "host_cut", "host_cut_brief") or (
        result["reported_hung"] == (kind in ("stopped_ps", "host_cut"))
        and (f"{result.get('signalled')} exited with code -9" in said) == (kind != "host_cut_brief"))
    # each loses a parameter server first
    ps_lost = kind in ("ps", "stopped_ps", "mid_restore", "after_training", "host_killed", "host_cut")
    # A brief cut restarts nothing: training went on through it.
    cut_went_on = kind not in ("host_cut", "host_cut_brief") or not result.get("brief_cut_restarted", True)
    result["ok"] = (result["rc"] == 0 and result["finished"] and not result["traceback_shown"]
                    and hang_found_right and (result["restart_explained"] or not ps_lost)
                    and not result["left_behind"]
                    and result["rows_differing"] == 0 and "error" not in result
                    and all(0 <= lost <= BACKUP_EVERY + STEPS_PER_EXECUTION for lost in result["steps_lost"])
                    and (result["restores"] > 0) == (kind not in ("worker", "host_cut_brief"))
                    and cut_went_on and (kind != "host_cut_brief" or not result["trained_after_restart"])
                    and (kind != "after_training" or not result["trained_after_restart"])
                    and result.get("versions_serving", 2) == result.get("versions", 2) >= 2)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated kinds; with --rounds beyond their number, drawn at random")
    parser.add_argument("--jobs", default="train,stream",
                        help="comma-separated jobs (train: train_ctr.py, train_sync: train_ctr.py --sync, "
                        "train_all: train_ctr.py with a worker cache, admission, eviction and a row cap, "
                        "stream: stream_ctr.py), taken in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang_timeout", type=float, default=HANG_TIMEOUT,
                        help="tfps-launch's --hang_timeout (a stopped or cut off task is found after it)")
    parser.add_argument("--work_dir", default=None)
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}; the kinds are {', '.join(KINDS)}")
    jobs = args.jobs.split(",")
    if set(jobs) - set(JOBS) or not jobs:
        parser.error(f"unknown jobs {sorted(set(jobs) - set(JOBS))}; the jobs are {', '.join(JOBS)}")
    for job in jobs:
        if not set(kinds) & set(JOBS[job].kinds):
            parser.error(f"none of the kinds {kinds} applies to the {job} job")
    globals()["HANG_TIMEOUT"] = args.hang_timeout  # every round's
    rng = random.Random(args.seed)
    rounds, untried = [], list(kinds)  # each kind once, where a job takes it; then at random
    for index in range(args.rounds):
        job = JOBS[jobs[index % len(jobs)]]
        kind = next((k for k in untried if k in job.kinds), None) or rng.choice(
            [k for k in kinds if k in job.kinds])
        untried = [k for k in untried if k != kind]
        rounds.append((kind, job))
    work = args.work_dir or tempfile.mkdtemp(prefix="tfps-faults-")
    data_dir = os.path.join(work, "data")
    sys.path.insert(0, ROOT)
    import tfps
    tfps.data.write_criteo(data_dir, 4, ROWS_PER_FILE, seed=0)
    results = []
    for index, (kind, job) in enumerate(rounds):
        results.append(run_round(kind, job, index, rng, work, data_dir))
        print(json.dumps(results[-1]), flush=True)
    print("\n| round | job | fault | outcome | rc | restores | steps lost | recover s | rows compared | rows differing | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "brief_cut_steps" in r:  # what the brief cut cost, though it restarted nothing
            r["fault"] = (f"{r.get('fault', r.get('error'))}; during the brief cut {r['brief_cut_steps']} step(s) ran, "
                          f"the next block came {r['brief_cut_next_block_s']} s after it")
        print(f"| {r['round']} | {r['job']}{' --sync' if r['sync'] else ''} | {r.get('fault', r.get('error'))} | {'ok' if r['ok'] else 'FAILED'} | {r['rc']} | "
              f"{r['restores']} | {r['steps_lost']} | {r['recover_s']} | {r['rows_compared']} | {r['rows_differing']} | {r['seconds']} |")
    failed = [r for r in results if not r["ok"]]
    print(f"\n{len(results) - len(failed)} of {len(results)} rounds ok; work in {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
