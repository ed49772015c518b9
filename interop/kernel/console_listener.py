#!/usr/bin/env python3
"""The host's end of a lab guest's kernel console (netconsole over the guest's user-mode NIC).

  console_listener.py FILE SECONDS

Binds a UDP port on 127.0.0.1 (QEMU's user-mode network delivers the guest's 10.0.2.2 there),
prints the port number on one line, then appends every datagram to FILE until SECONDS have
passed or it is killed. A guest whose kernel panics dies before `dmesg -w` can write its last
messages into the shared directory; netconsole sends them from the panic itself.
"""
import socket
import sys
import time


def main():
    path, seconds = sys.argv[1], float(sys.argv[2])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    deadline = time.monotonic() + seconds
    with open(path, "ab") as out:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except socket.timeout:
                return
            out.write(data)
            out.flush()


if __name__ == "__main__":
    main()
