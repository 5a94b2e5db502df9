"""Clusters across hosts (tests/hosts.py: per task a network namespace with its own
address, its own /tmp, and the shared directory at one path): the main job and the
streaming example train on 5 hosts, write to the shared directory and resume from it; a
location local to each host is refused; a task that cannot reach the data service it was
handed fails naming it; and the harness leaves nothing behind, also when SIGKILLed."""

import glob
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from benchmarks import faults
from tests import hosts as hosts_lib
from tests import hosts_cleanup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = hosts_lib.skip_without_hosts()

TRAIN = os.path.join(ROOT, "examples", "train_ctr.py")
TRAIN_ARGS = ["--num_files", "2", "--rows_per_file", "3000", "--epochs", "2", "--steps_per_epoch", "5",
              "--batch_size", "256"]
STREAM = os.path.join(ROOT, "examples", "stream_ctr.py")
# 3 chunks of 10 steps (a block of steps_per_execution), a backup after each: the hold is
# in the third, after the last step, so the restarted cluster resumes the second's.
STREAM_ARGS = ["--examples", str(30 * 256), "--chunk", str(10 * 256), "--eval_examples", "512",
               "--batch_size", "256", "--backup_every_steps", "10"]


def links():
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def run_processes(run_id):
    """Live processes that inherited the run's TFPS_HOSTS_RUN."""
    found = []
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(environ, "rb") as f:
                marked = f"TFPS_HOSTS_RUN={run_id}".encode() in f.read().split(b"\0")
        except OSError:
            continue
        if marked and alive(int(environ.split("/")[2])):
            found.append(int(environ.split("/")[2]))
    return found


def assert_clean(run_id, links_before):
    """Nothing of the run is left: namespaces, links, mounts, processes, directory."""
    assert hosts_cleanup.namespaces(run_id) == []
    assert links() == links_before
    with open("/proc/self/mountinfo") as f:
        assert run_id not in f.read()
    assert run_processes(run_id) == []
    assert not os.path.exists(hosts_cleanup.run_dir(run_id))


def launch_and_kill(hosts, shared, name, arguments, hold, victim):
    """Runs tfps-launch (one cluster restart allowed) on the hosts; when the chief holds at
    `hold` (examples/fault_report.py), kills every process of host `victim`. Returns (exit
    code, the chief's output, the launcher's messages)."""
    report = shared / f"report-{name}"
    out, err = shared / f"{name}.out", shared / f"{name}.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        launcher = hosts.launch(["--max_restarts", "1", "--log_dir", str(shared / f"logs-{name}"), *arguments,
                                 "--fault_report", str(report), "--fault_hold", hold],
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), stdout=stdout, stderr=stderr)
        try:
            faults.wait_for(lambda: os.path.exists(report / f"holding-{hold}"), 600, hold, launcher)
            assert hosts.kill_host(victim)
            launcher.wait(timeout=600)
        finally:
            launcher.kill()
            launcher.wait()
    return launcher.returncode, out.read_text(), err.read_text()


def test_the_main_job_and_the_stream_train_across_five_hosts_and_resume_from_shared_storage(tmp_path):
    """Chief, 2 workers and 2 parameter servers on hosts of their own: the workers read the
    chief's tf.data service at the chief's address. The main job writes its epoch
    checkpoints and export to the shared directory; a parameter server's host killed after
    training restarts the cluster, which resumes the last epoch checkpoint from there, row
    for row, and trains no step again. The stream backs up and exports serving versions
    there; a host killed mid-backup restarts it from its backups, row for row."""
    shared = tmp_path / "shared"
    shared.mkdir()
    before = links()
    with hosts_lib.Hosts.for_cluster(2, 2, str(shared)) as hosts:
        run_id = hosts.run_id
        train = launch_and_kill(hosts, shared, "train", [
            TRAIN, *TRAIN_ARGS, "--data_dir", str(shared / "data"), "--out_dir", str(shared / "run"),
            "--export_dir", str(shared / "export" / "1")], "after_training", "ps_1")
        stream = launch_and_kill(hosts, shared, "stream", [
            STREAM, *STREAM_ARGS, "--out_dir", str(shared / "stream"), "--serving_dir", str(shared / "serving"),
            "--export_every_seconds", "2", "--whole_at_end"], "backup", "ps_0")
    assert_clean(run_id, before)

    code, out, said = train
    assert code == 0, out[-3000:] + said[-3000:]
    assert "ps_1 exited with code -9" in said and "restarting the whole cluster" in said
    # Both epochs trained once, in the first cluster (the chief's log holds both clusters'
    # output; the terminal, not what the chief printed just before the loss); the restarted
    # one resumed the second.
    chief_log = (shared / "logs-train" / "chief_0.log").read_text()
    assert re.findall(r"^epoch (\d):", chief_log, re.M) == ["1", "2"], chief_log[-3000:]
    checkpoints = shared / "run" / "checkpoints"
    assert (f"resumed from the epoch checkpoint {checkpoints / 'weights-02'} (2 epoch(s) trained)") in out
    assert "eval over 3,000 examples" in out and "exported {'fields':" in out
    sizes = eval(out.split("table sizes per PS shard: ")[1].split("\n")[0])
    assert len(sizes) == 2 and min(sizes) > 0  # the rows live on both parameter servers
    for shard in ("00000", "00001"):  # each parameter server wrote its shard to the shared directory
        assert glob.glob(str(checkpoints / f"weights-02*shard-{shard}-of-00002*")), os.listdir(checkpoints)
    assert (shared / "export" / "1" / "saved_model.pb").exists()
    job = faults.Job("train_ctr", TRAIN_ARGS, 2, 5, "fields", "eval over")
    compared, differing, restores = faults.compare_restores(job, str(shared / "report-train"))
    assert restores == 1 and compared == sum(sizes) and differing == 0

    code, out, said = stream
    assert code == 0, out[-3000:] + said[-3000:]
    assert "ps_0 exited with code -9" in said and "restarting the whole cluster" in said
    assert f"resuming at chunk 2, step 0 from the backups in {shared / 'stream' / 'backup'}" in out
    assert "stream done: 7,680 examples" in out
    job = faults.Job("stream_ctr", STREAM_ARGS, 3, 10, "ids_table", "stream done")
    compared, differing, restores = faults.compare_restores(job, str(shared / "report-stream"))
    assert restores == 1 and compared > 0 and differing == 0
    versions, serving = faults.versions_serving(str(shared / "serving"))
    assert versions >= 1 and serving == versions


def test_a_location_local_to_each_host_is_refused_naming_the_task_and_file(tmp_path):
    """--out_dir in /tmp, which is each host's own: the first save fails at once, naming the
    location and a parameter server that does not see it, and the run ends with an error."""
    shared = tmp_path / "shared"
    shared.mkdir()
    import tfps
    tfps.data.write_criteo(str(shared / "data"), 2, 3000, seed=0)
    before = links()
    with hosts_lib.Hosts.for_cluster(2, 2, str(shared)) as hosts:
        run_id = hosts.run_id
        run = subprocess.run(hosts.launch_command([
            "--max_restarts", "0", "--log_dir", str(shared / "logs"), TRAIN, *TRAIN_ARGS,
            "--data_dir", str(shared / "data"), "--out_dir", "/tmp/run"]),
            env=hosts.environment(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")), cwd=ROOT, capture_output=True,
            text=True, timeout=600)
        # The chief's own /tmp/run holds its files and none of the parameter servers'.
        written = os.listdir(os.path.join(hosts.private_dir("chief_0"), "run"))
    assert_clean(run_id, before)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"tfps: the checkpoint location /tmp/run/\S+ is not the same storage on "
                     r"/job:ps/replica:0/task:0 as here: the file /tmp/run/\S+ written here is not visible "
                     r"on /job:ps/replica:0/task:0; every task must reach the checkpoint location",
                     run.stdout), run.stdout[-3000:]
    assert "eval over" not in run.stdout and written


def test_a_data_service_the_reader_cannot_reach_fails_naming_its_address():
    """Instead of tf.data service's hour of retries: a refused dispatcher fails the reader
    within the timeout given, naming the address."""
    import tensorflow as tf
    from tfps.cluster._ports import free_ports
    from tfps.data import _service as service
    address = f"grpc://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    with pytest.raises(tf.errors.DeadlineExceededError, match=rf"cannot reach the tf.data service .* at "
                                                               rf"{address} \(Connection refused, for 1 s\)"):
        service.distribute(tf.data.Dataset.range(4), address, "unreachable", timeout_seconds=1)


def test_a_harness_killed_mid_run_leaves_no_namespace_link_mount_or_process(tmp_path):
    """The harness SIGKILLed while every task (and a child each task started in its
    session, which the launcher's death does not reach) runs: its watchdog removes all."""
    shared = tmp_path / "shared"
    shared.mkdir()
    pipe = shared / "pids"
    os.mkfifo(pipe)
    before = links()
    reader = os.open(pipe, os.O_RDWR | os.O_NONBLOCK)  # a writer of its own: no end of file
    harness = subprocess.Popen(
        [sys.executable, "-m", "tests.hosts", "--shared", str(shared), "--", "--log_dir", str(shared / "logs"),
         os.path.join(ROOT, "tests", "cluster_programs", "spawning_program.py"), str(pipe), "--hold"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        announced = harness.stderr.readline()
        run_id, watchdog = re.search(r"hosts: run (\w+), watchdog pid (\d+)", announced).groups()
        pids, text, deadline = {}, "", time.monotonic() + 120
        while len(pids) < 10 and time.monotonic() < deadline:  # 5 tasks and their children
            select.select([reader], [], [], 1)
            try:
                text += os.read(reader, 4096).decode()
            except BlockingIOError:
                continue
            pids = dict(line.split() for line in text.splitlines())
        assert len(pids) == 10, text
        assert len(hosts_cleanup.namespaces(run_id)) == 6  # 5 hosts and the switch
        assert all(alive(int(pid)) for pid in pids.values())
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        deadline = time.monotonic() + 60
        while alive(int(watchdog)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(int(watchdog))
    finally:
        os.close(reader)
        if harness.poll() is None:
            harness.kill()
            harness.wait()
    assert_clean(run_id, before)
    assert not [name for name, pid in pids.items() if alive(int(pid))]


# A TensorFlow server of the cluster, as strategy_from_tf_config() starts a parameter
# server's: it prints once it serves, then serves until killed.
SERVER = """
import json, sys, time
import tensorflow as tf
server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(sys.argv[1])), job_name="ps", task_index=0,
                              start=True)
print("serving", flush=True)
server.join()
"""
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()"


def test_a_task_listens_on_every_interface_and_only_its_network_reaches_it(tmp_path):
    """What docs/cluster.md says of who can reach a cluster: a parameter server's TensorFlow
    server listens on every interface of its host (ss: *:PORT, or 0.0.0.0:PORT; TensorFlow
    has no option for the address it binds), so the cluster's hosts connect to it, and so
    does a sixth namespace outside the cluster's network through a second network the host
    is on; from that outside network alone (joined to the cluster's by a router that
    forwards nothing) it cannot connect."""
    shared = tmp_path / "shared"
    shared.mkdir()
    before = links()
    with hosts_lib.Hosts.for_cluster(2, 2, str(shared)) as hosts:
        run_id = hosts.run_id
        switch, outside, ps = hosts.namespace("switch"), hosts.namespace("outside"), hosts.namespace("ps_0")
        # The outside: a namespace of the run (the watchdog removes it too) on 10.213.78.0/24,
        # routed through the switch's namespace, which does not forward.
        ip = hosts_lib._ip  # pylint: disable=protected-access
        ip("netns", "add", outside)
        ip("-n", outside, "link", "set", "lo", "up")
        ip("-n", switch, "link", "add", "out0", "type", "veth", "peer", "name", "eth0", "netns", outside)
        ip("-n", switch, "addr", "add", "10.213.78.1/24", "dev", "out0")
        ip("-n", switch, "link", "set", "out0", "up")
        ip("-n", outside, "addr", "add", "10.213.78.2/24", "dev", "eth0")
        ip("-n", outside, "link", "set", "eth0", "up")
        ip("-n", outside, "route", "add", "default", "via", "10.213.78.1")
        forwarding = subprocess.run(["ip", "netns", "exec", switch, "sysctl", "-n", "net.ipv4.ip_forward"],
                                    capture_output=True, text=True, check=True).stdout.strip()
        assert forwarding == "0"
        # ps_0's second network, shared with the outside: 10.213.79.0/24.
        ip("-n", ps, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1", "netns", outside)
        ip("-n", ps, "addr", "add", "10.213.79.13/24", "dev", "eth1")
        ip("-n", ps, "link", "set", "eth1", "up")
        ip("-n", outside, "addr", "add", "10.213.79.2/24", "dev", "eth1")
        ip("-n", outside, "link", "set", "eth1", "up")
        cluster = {"chief": [f"{hosts.address('chief_0')}:{hosts_lib.PORT}"],
                   "worker": [f"{hosts.address(f'worker_{i}')}:{hosts_lib.PORT}" for i in range(2)],
                   "ps": [f"{hosts.address(f'ps_{i}')}:{hosts_lib.PORT}" for i in range(2)]}
        server = subprocess.Popen([*hosts.exec_prefix("ps_0"), sys.executable, "-c", SERVER, json.dumps(cluster)],
                                  env=hosts.environment(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")),
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert server.stdout.readline().strip() == "serving"
            listening = subprocess.run(["ip", "netns", "exec", ps, "ss", "-ltnH"], capture_output=True, text=True,
                                       check=True).stdout
            local = [line.split()[3] for line in listening.splitlines() if line.split()[3].endswith(f":{hosts_lib.PORT}")]
            assert local and set(local) <= {f"*:{hosts_lib.PORT}", f"0.0.0.0:{hosts_lib.PORT}",
                                            f"[::]:{hosts_lib.PORT}"}, listening

            def connects(namespace, address):
                return subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", CONNECT, address,
                                       str(hosts_lib.PORT)], capture_output=True).returncode == 0
            ps_address = hosts.address("ps_0")
            assert connects(hosts.namespace("chief_0"), ps_address)
            assert connects(hosts.namespace("worker_1"), ps_address)
            assert connects(outside, "10.213.79.13")  # the host's other network: every interface listens
            assert not connects(outside, ps_address)  # the cluster's network is not the outside's
        finally:
            server.kill()
            server.wait()
    assert_clean(run_id, before)
