"""The benchmarks' measuring and reporting tools, on inputs whose answer is known: the
traffic counter on a socket pair and a written log, and the report on saved results."""

import json
import os
import socket
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import report  # noqa: E402
import traffic  # noqa: E402


def test_tcp_bytes_counts_what_a_process_sends_and_receives():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    assert traffic.listening_pid(port) == os.getpid()
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    before = traffic.tcp_bytes(os.getpid())
    client.sendall(b"x" * 100_000)
    received = 0
    while received < 100_000:
        received += len(accepted.recv(1 << 20))
    accepted.sendall(b"y" * 3_000)
    assert len(client.recv(1 << 20)) > 0
    time.sleep(0.1)
    sent, got = (a - b for a, b in zip(traffic.tcp_bytes(os.getpid()), before))
    # Both ends are this process: each byte is counted once sent and once received.
    assert sent == got == 103_000
    for s in (client, accepted, server):
        s.close()


LOG = """\
I0000 00:00:100.000000   1 process_function_library_runtime.cc:1141] Running component function on device /job:ps/replica:0/task:1/device:CPU:0 from f with handle 1
I0000 00:00:200.500000   1 process_function_library_runtime.cc:1141] Running component function on device /job:ps/replica:0/task:0/device:CPU:0 from f with handle 2
I0000 00:00:200.600000   1 process_function_library_runtime.cc:1128] Running component function on device /job:worker/replica:0/task:0/device:CPU:0 from f with handle 0
I0000 00:00:200.700000   1 grpc_remote_worker.cc:202] RecvTensorAsync req: goo.gle/debugonly
step_id: 1
rendezvous_key: "/job:ps/replica:0/task:1/device:CPU:0;0a;/job:worker/replica:0/task:0/device:CPU:0;edge_1_rows;0:0"
request_id: 2

I0000 00:00:200.800000   1 grpc_remote_worker.cc:202] RecvTensorAsync req: goo.gle/debugonly
rendezvous_key: "/job:worker/replica:0/task:0/device:CPU:0;0b;/job:ps/replica:0/task:0/device:CPU:0;edge_2_keys;0:0"
I0000 00:00:300.000000   1 grpc_remote_worker.cc:202] RecvTensorAsync req: goo.gle/debugonly
rendezvous_key: "/job:ps/replica:0/task:0/device:CPU:0;0c;/job:worker/replica:0/task:0/device:CPU:0;edge_3_late;0:0"
"""


def test_calls_are_counted_per_ps_within_the_window(tmp_path):
    (tmp_path / "worker_0.log").write_text(LOG)
    # A PS's own component functions are local runs, not calls to it.
    (tmp_path / "ps_0.log").write_text(LOG.splitlines()[1] + "\n")
    (tmp_path / "launcher.log").write_text(LOG)
    assert traffic.calls_per_ps(str(tmp_path), 150.0, 250.0) == {0: 2, 1: 1}
    assert traffic.calls_per_ps(str(tmp_path), 0.0, 1000.0) == {0: 3, 1: 2}


def test_cpu_seconds_grow_with_work():
    before = traffic.cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert traffic.cpu_seconds(os.getpid()) - before >= 0.2


def test_the_report_renders_saved_results_as_markdown_and_plots(tmp_path):
    machine = {"machine": {"cpu": "Test CPU", "cores": 2, "python": "3.11"}}
    saved = {
        "train_pss": [machine, {"model": "tfps"},
                      {"summary": "examples/s >= 1.5x stock", "ratio": 1.21, "met": False},
                      {"summary": "AUC at most 0.002 below stock", "mean_difference": 0.001, "met": True}],
        "table_ops": [machine, {"summary": "find vs DenseHashTable", "dim": 8, "keys": "zipf", "ratio": 3.5,
                                "met": True}],
    }
    for name, records in saved.items():
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    report.main(["--from", str(tmp_path), "--only", "train_pss,table_ops"])
    text = (tmp_path / "report.md").read_text()
    assert "Machine: Test CPU, 2 cores" in text
    assert "| train_pss | examples/s >= 1.5x stock | ratio | 1.21 | **no** |" in text
    assert "| train_pss | AUC at most 0.002 below stock | mean_difference | 0.001 | yes |" in text
    assert "| table_ops | find vs DenseHashTable (dim 8, keys zipf) | ratio | 3.5 | yes |" in text
    for name in saved:
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_refuses_unknown_benchmarks(tmp_path):
    with pytest.raises(SystemExit):
        report.main(["--from", str(tmp_path), "--only", "no_such_benchmark"])
