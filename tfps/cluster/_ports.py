"""Free local ports for a cluster's tasks, without TensorFlow: tfps-launch needs them
before any task starts."""

import socket


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1."""
    sockets, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports
