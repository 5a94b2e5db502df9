"""benchmarks/faults.py's rounds: the main job or the streaming example under tfps-launch
with a task killed (or stopped) at a random moment, once per fault kind. Each must end with
exit code 0 and the job's last line, every restore equal row by row to the backup it came
from, at most one backup interval lost per restore, a lost parameter server restarting the
whole cluster with the terminal saying where the chief's errors are (a stopped one found
silent and killed first), no step trained again after a fault that came once training had
ended, and no process left behind. The host kinds run on tests/hosts.py's hosts (root only):
a host's processes killed, and a host cut off briefly and then past the launcher's deadline;
they leave no namespace behind either."""

import json
import random

import pytest

from benchmarks import faults
from tests import hosts
import tfps


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("criteo"))
    tfps.data.write_criteo(directory, 4, faults.ROWS_PER_FILE, seed=0)
    return directory


# Each kind once: the main job for a killed parameter server, worker or chief and a kill
# mid-backup; the stream (one chain across its chunks' fits) for a kill mid-restore (after
# a killed parameter server) and a stopped parameter server; the main job again for a
# parameter server killed after training, which must resume from its epoch checkpoint; and
# the main job in synchronous steps with a stopped parameter server; and the main job with
# everything on (a worker cache, admission, eviction, a row cap) with a killed parameter server.
# Across hosts (tests/hosts.py, as root): a parameter server's host killed; and one round
# for both cuts of a host's link, a brief one (training goes on, nothing restarts) and then
# one past the launcher's health check deadline (the cluster restarts).
ACROSS_HOSTS = hosts.skip_without_hosts()
ROUNDS = [("train", "ps"), ("train", "worker"), ("train", "chief"), ("train", "mid_backup"),
          ("stream", "mid_restore"), ("stream", "stopped_ps"), ("train", "after_training"),
          ("train_sync", "stopped_ps"), ("train_all", "ps"),
          pytest.param("train", "host_killed", marks=ACROSS_HOSTS),
          pytest.param("train", "host_cut", marks=ACROSS_HOSTS)]
tried = {kind for _, kind in (r.values if hasattr(r, "values") else r for r in ROUNDS)}
assert tried | {"host_cut_brief"} == set(faults.KINDS)  # host_cut begins with a brief cut


@pytest.mark.parametrize("job,kind", ROUNDS)
def test_the_job_survives_a_fault_of_each_kind(tmp_path, data_dir, job, kind):
    result = faults.run_round(kind, faults.JOBS[job], 0, random.Random(kind), str(tmp_path), data_dir)
    print(json.dumps(result))
    assert result["ok"], result
    if kind != "worker":  # the stream's table is smaller: its IDs must come twice to be admitted
        assert result["rows_compared"] > {"train": 50_000, "train_sync": 50_000, "train_all": 20_000,
                                          "stream": 10_000}[job] and result["restores"] >= 1
    if kind == "host_cut":  # the brief cut first: training went on, nothing restarted
        assert result["brief_cut_restarted"] is False and result["reported_hung"]
