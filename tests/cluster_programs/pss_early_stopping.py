"""Run by tests/test_early_stopping.py: tests/early_stopping_check.train under an in-process
ParameterServerStrategy (2 workers, 2 parameter servers, the table sharded over both), for
each case given as JSON on the command line; prints the results as JSON."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

from tests import early_stopping_check  # noqa: E402
import tfps  # noqa: E402


def main():
    cases = json.loads(sys.argv[1])
    with tfps.distribute.local_cluster(num_workers=2, num_ps=2) as strategy:
        results = [early_stopping_check.train(strategy=strategy, **case) for case in cases]
    json.dump(results, sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # in-process servers cannot be stopped; end the process without waiting


if __name__ == "__main__":
    main()
