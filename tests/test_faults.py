"""benchmarks/faults.py's rounds: the main job under tfps-launch with a task killed (or
stopped) at a random moment, once per fault kind, and the streaming example (one backup
chain across its chunks' fits) with a parameter server killed while it trains and while it
restores. Each must end with exit code 0 and the job's last line, every restore equal row by
row to the backup it came from, at most one backup interval lost per restore, and no process
left behind."""

import json
import random

import pytest

from benchmarks import faults
import tfps


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("criteo"))
    tfps.data.write_criteo(directory, 4, faults.ROWS_PER_FILE, seed=0)
    return directory


@pytest.mark.parametrize("job,kind", [("train", kind) for kind in faults.KINDS] +
                         [("stream", "ps"), ("stream", "mid_restore")])
def test_the_job_survives_a_fault_of_each_kind(tmp_path, data_dir, job, kind):
    result = faults.run_round(kind, faults.JOBS[job], 0, random.Random(kind), str(tmp_path), data_dir)
    print(json.dumps(result))
    assert result["ok"], result
    if kind != "worker":  # the stream's table is smaller: its IDs must come twice to be admitted
        assert result["rows_compared"] > {"train": 50_000, "stream": 10_000}[job] and result["restores"] >= 1
