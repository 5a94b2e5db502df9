"""Run by tests/test_save_chains.py: tests/save_chains_check.py's interleaved savers on a
table sharded over the 2 parameter servers of an in-process cluster. Prints JSON."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tfps  # noqa: E402
from tests.save_chains_check import check_interleaved_savers, make_table  # noqa: E402
from tfps.table.sharded_table import ShardedTable  # noqa: E402


def main(directory):
    with tfps.distribute.local_cluster(num_workers=1, num_ps=2) as strategy:
        with strategy.scope():
            result = check_interleaved_savers(lambda: make_table(ShardedTable), directory)
            result["shards"] = make_table(ShardedTable).num_shards
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
