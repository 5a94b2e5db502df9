"""One round of each fault kind of benchmarks/faults.py: the main job under tfps-launch
with a task killed (or stopped) at a random moment, ending with exit code 0, every restore
equal row by row to the backup it came from, at most one backup interval lost per
restore, and no process left behind."""

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


@pytest.mark.parametrize("kind", faults.KINDS)
def test_the_main_job_survives_a_fault_of_each_kind(tmp_path, data_dir, kind):
    result = faults.run_round(kind, 0, random.Random(kind), str(tmp_path), data_dir)
    print(json.dumps(result))
    assert result["ok"], result
    if kind != "worker":
        assert result["rows_compared"] > 50_000 and result["restores"] >= 1
