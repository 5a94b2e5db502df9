"""The benchmarks' measuring and reporting tools, on inputs whose answer is known: the
traffic counter on a socket pair and a written log, and the report on saved results."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import report  # noqa: E402
import traffic  # noqa: E402


PEER = """
import socket, sys
peer = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
peer.sendall(b"p" * 70_000)
received = 0
while received < 30_000:
    received += len(peer.recv(1 << 20))
print("done", flush=True)
sys.stdin.read()  # holds the connection open until the test has read the counters
"""


def test_socket_bytes_count_what_each_process_sends_and_receives():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    assert traffic.listening_pid(port) == os.getpid()
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        ours_before = traffic.socket_bytes(os.getpid())
        accepted, _ = server.accept()
        received = 0
        while received < 70_000:
            received += len(accepted.recv(1 << 20))
        accepted.sendall(b"s" * 30_000)
        assert peer.stdout.readline().strip() == "done"
        # This process sent 30,000 and received 70,000 bytes; the peer the reverse. The
        # kernel counts a sent byte once it is acknowledged, a moment after the peer read it.
        expected = {os.getpid(): (ours_before, (30_000, 70_000)), peer.pid: ({}, (70_000, 30_000))}
        deadline = time.monotonic() + 10
        while True:
            measured = {pid: traffic.bytes_between(before, traffic.socket_bytes(pid))
                        for pid, (before, _) in expected.items()}
            if all(measured[pid] == want for pid, (_, want) in expected.items()) or time.monotonic() > deadline:
                break
        assert measured == {pid: want for pid, (_, want) in expected.items()}
    finally:
        peer.stdin.close()
        peer.wait(timeout=30)
        server.close()


LOG = """\
I0000 00:00:1795000100.000000   1 process_function_library_runtime.cc:1141] Running component function on device /job:ps/replica:0/task:1/device:CPU:0 from f with handle 1
I0000 00:00:1795000200.500000   1 process_function_library_runtime.cc:1141] Running component function on device /job:ps/replica:0/task:0/device:CPU:0 from f with handle 2
I0000 00:00:1795000200.600000   1 process_function_library_runtime.cc:1128] Running component function on device /job:worker/replica:0/task:0/device:CPU:0 from f with handle 0
I0000 00:00:1795000200.700000   1 grpc_remote_worker.cc:202] RecvTensorAsync req: goo.gle/debugonly
step_id: 1
rendezvous_key: "/job:ps/replica:0/task:1/device:CPU:0;0a;/job:worker/replica:0/task:0/device:CPU:0;edge_1_rows;0:0"
request_id: 2

I0000 00:00:1795000200.800000   1 grpc_remote_worker.cc:202] RecvTensorAsync req: goo.gle/debugonly
rendezvous_key: "/job:worker/replica:0/task:0/device:CPU:0;0b;/job:ps/replica:0/task:0/device:CPU:0;edge_2_keys;0:0"
I0000 00:00:1795000200.900000   1 grpc_remote_worker.cc:202] RecvTensorAsync req: goo.gle/debugonly
rendezvous_key: "/job:ps/replica:0/task:1/device:CPU:0;0d;/job:ps/replica:0/task:0/device:CPU:0;edge_4_ps_to_ps;0:0"
I0000 00:00:1795000300.000000   1 grpc_remote_worker.cc:202] RecvTensorAsync req: goo.gle/debugonly
rendezvous_key: "/job:ps/replica:0/task:0/device:CPU:0;0c;/job:worker/replica:0/task:0/device:CPU:0;edge_3_late;0:0"
"""


def test_calls_are_counted_per_ps_within_the_window(tmp_path):
    (tmp_path / "worker_0.log").write_text(LOG)
    # A PS's own component functions are local runs, not calls to it.
    (tmp_path / "ps_0.log").write_text(LOG.splitlines()[1] + "\n")
    (tmp_path / "launcher.log").write_text(LOG)
    # The PS-to-PS RecvTensor counts once, for the PS it goes to (task 0).
    assert traffic.calls_per_ps(str(tmp_path), 1795000150.0, 1795000250.0) == {0: 3, 1: 1}
    assert traffic.calls_per_ps(str(tmp_path), 1795000000.0, 1795001000.0) == {0: 4, 1: 2}
    with pytest.raises(ValueError, match="no RPC log lines"):
        traffic.calls_per_ps(str(tmp_path), 1.8e9, 1.9e9)


def test_a_log_not_stamped_in_epoch_seconds_is_refused(tmp_path):
    (tmp_path / "worker_0.log").write_text(
        "I1127 03:12:47.123456   1 process_function_library_runtime.cc:1141] Running component function on "
        "device /job:ps/replica:0/task:0/device:CPU:0 from f with handle 1\n")
    with pytest.raises(ValueError, match="not in epoch seconds"):
        traffic.calls_per_ps(str(tmp_path), 0.0, 2e9)


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
        "metrics": [machine, {"summary": "eager: update >= 5x faster", "ratio_net_of_harness": 12.9,
                              "ratio_raw": 6.1, "met": True}],
    }
    for name, records in saved.items():
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    report.main(["--from", str(tmp_path), "--only", "train_pss,table_ops,metrics"])
    text = (tmp_path / "report.md").read_text()
    assert "Machine: Test CPU, 2 cores" in text
    assert "| train_pss | examples/s >= 1.5x stock | ratio | 1.21 | **no** |" in text
    assert "| train_pss | AUC at most 0.002 below stock | mean_difference | 0.001 | yes |" in text
    assert "| table_ops | find vs DenseHashTable (dim 8, keys zipf) | ratio | 3.5 | yes |" in text
    assert "| metrics | eager: update >= 5x faster | ratio_net_of_harness | 12.9 | yes |" in text
    for name in saved:
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_refuses_unknown_benchmarks(tmp_path, capsys):
    (tmp_path / "train_pss.jsonl").write_text('{"summary": "x", "ratio": 1.0}\n')
    with pytest.raises(SystemExit) as exit_info:
        report.main(["--from", str(tmp_path), "--only", "train_pss,no_such_benchmark"])
    assert exit_info.value.code == 2
    assert "unknown benchmarks ['no_such_benchmark']" in capsys.readouterr().err
