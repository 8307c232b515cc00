#!/usr/bin/env python3
"""What TLS itself sustains here, the baseline of a restore from a peer's
memory (docs/benchmarks.md "Peer transfers"): one connection over
loopback, as ckptd's peer links make them (TLS 1.3 as OpenSSL negotiates
it, an EC P-256 certificate made here), the server sending --mb MiB in
1 MiB writes and the client reading them into one buffer; MB/s, median
of --rounds (and the range). Python's ssl module is OpenSSL's; the 1 MiB
writes make its per-call cost small against the cipher's.

    .venv-test/bin/python tests/bench/tls_rate.py --mb 1024 --rounds 3

`openssl s_server`/`s_client` move the same bytes through 16 KiB reads of
a pipe and are no measure of TLS (312 MB/s here)."""
import argparse
import os
import socket
import ssl
import statistics
import subprocess
import tempfile
import threading
import time

def certs(d):
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    subprocess.run(f"cd {d} && openssl req -x509 {ec} -keyout k.pem -out c.pem -days 2 -subj /CN=peer",
                   shell=True, check=True, capture_output=True)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    d = tempfile.mkdtemp()
    certs(d)
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(f"{d}/c.pem", f"{d}/k.pem")
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.check_hostname = False
    cctx.verify_mode = ssl.CERT_NONE
    buf = os.urandom(1 << 20)
    rates = []
    for _ in range(a.rounds):
        ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
        port = ls.getsockname()[1]
        def serve():
            c, _ = ls.accept()
            s = sctx.wrap_socket(c, server_side=True)
            for _ in range(a.mb):
                s.sendall(buf)
            s.close()
        t = threading.Thread(target=serve); t.start()
        c = cctx.wrap_socket(socket.create_connection(("127.0.0.1", port)))
        cipher = c.cipher()
        got, t0 = 0, time.monotonic()
        rb = bytearray(1 << 20)
        while got < a.mb << 20:
            n = c.recv_into(rb)
            if not n:
                break
            got += n
        dt = time.monotonic() - t0
        c.close(); t.join(); ls.close()
        rates.append(got / dt / 1e6)
    print(f"{cipher[0]} {cipher[1]}: {statistics.median(rates):.0f} MB/s median of {a.rounds} "
          f"({min(rates):.0f}-{max(rates):.0f}), {a.mb} MiB each")


if __name__ == "__main__":
    main()
