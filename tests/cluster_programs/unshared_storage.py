"""Run by tests/test_save_chains.py under tfps-launch (2 ps, 1 worker): every task works in
a directory of its own, BASE/<task>, so a relative checkpoint path names different storage
on each task, as a local path does on several machines. The chief saves a sharded table to
a relative path (its parameter servers' files land where the chief cannot see them), saves
it to a shared absolute path, and restores from a relative copy of that checkpoint whose
table files only the chief has. Prints JSON with the errors."""

import json
import os
import shutil
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
BASE = sys.argv[1]
TASK = json.loads(os.environ["TF_CONFIG"])["task"]
os.makedirs(os.path.join(BASE, f"{TASK['type']}_{TASK['index']}"), exist_ok=True)
os.chdir(os.path.join(BASE, f"{TASK['type']}_{TASK['index']}"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfps  # noqa: E402
from tfps.table.sharded_table import ShardedTable  # noqa: E402


def error_of(call):
    try:
        call()
    except tf.errors.OpError as e:
        return type(e).__name__, e.message
    return None, None


def main():
    strategy = tfps.distribute.strategy_from_tf_config()
    with strategy.scope():
        table = ShardedTable(4)
    keys = np.arange(1000, dtype=np.int64)
    table.find_or_insert(keys)
    checkpoint = tf.train.Checkpoint(table=table)
    out = {}
    out["save_kind"], out["save_message"] = error_of(lambda: checkpoint.write("relative/ckpt"))
    out["manifest_written"] = os.path.exists("relative/ckpt.index")
    # The failed save recorded no chain: the next save of changes there is whole.
    shared = os.path.join(BASE, "shared")
    with tfps.checkpoint.changes_only(chain=os.path.abspath("relative")):
        path = checkpoint.write(os.path.join(shared, "ckpt"))
    out["rows_after_failed_save"] = int(np.sum(tf.train.load_checkpoint(path).get_tensor("table/rows")))
    os.makedirs("copy", exist_ok=True)
    for name in os.listdir(shared):
        shutil.copy(os.path.join(shared, name), "copy")
    restored = ShardedTable(4, devices=table.devices)
    out["restore_kind"], out["restore_message"] = error_of(
        lambda: tf.train.Checkpoint(table=restored).read("copy/ckpt"))
    out["restored_rows"] = int(restored.size())
    print(json.dumps(out), flush=True)
    os._exit(0)  # the ps and worker tasks are stopped by the launcher


if __name__ == "__main__":
    main()
