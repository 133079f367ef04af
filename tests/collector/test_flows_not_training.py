"""A real capture of traffic that is not a training job: SSH, HTTPS, HTTP and DNS on loopback.

tcpdump records real sockets: an SSH-like session on port 22 (banner, keystrokes, a bulk copy),
HTTPS with a real TLS handshake on 443 fetched repeatedly by curl over keep-alive (large periodic
responses: the shape a naive recogniser takes for gradient all-reduces), plain HTTP on 80, and DNS
queries on UDP 53, between three loopback addresses. `laggard capture --read` must find no
training job, and `laggard localize --flows` must give no verdict.
"""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="binding ports 22/53/80/443 and tcpdump need root"),
              pytest.mark.skipif(not all(shutil.which(t) for t in ("tcpdump", "curl", "openssl")),
                                 reason="needs tcpdump, curl and openssl")]

SERVER, CLIENTS = "127.0.0.2", ("127.0.0.3", "127.0.0.4")


def _serve_ssh(stop: threading.Event) -> None:
    """An SSH-like server: banner exchange, echo of small keystroke packets, then a bulk copy."""
    srv = socket.create_server((SERVER, 22))
    srv.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        with conn:
            conn.sendall(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n")
            while (data := conn.recv(65536)) and data != b"scp\n":
                conn.sendall(data[:48])
            conn.sendall(os.urandom(3 << 20))
    srv.close()


def _ssh_client(src: str) -> None:
    with socket.create_connection((SERVER, 22), source_address=(src, 0)) as s:
        s.recv(256)
        s.sendall(b"SSH-2.0-OpenSSH_9.6p1\r\n")
        for _ in range(40):  # typing
            s.sendall(os.urandom(36))
            s.recv(256)
            time.sleep(0.02)
        s.sendall(b"scp\n")
        got = 0
        while got < 3 << 20 and (chunk := s.recv(1 << 20)):
            got += len(chunk)


def _serve_dns(stop: threading.Event) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((SERVER, 53))
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            q, peer = sock.recvfrom(512)
        except TimeoutError:
            continue
        answer = q[:2] + b"\x81\x80" + q[4:6] + b"\x00\x01\x00\x00\x00\x00" + q[12:] + b"\xc0\x0c\x00\x01\x00\x01" \
            + struct.pack(">IH", 300, 4) + bytes([10, 0, 0, 7])
        sock.sendto(answer, peer)
    sock.close()


def _dns_client(src: str) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((src, 0))
    for i in range(30):
        name = b"".join(bytes([len(p)]) + p for p in (b"node%d" % i, b"cluster", b"internal")) + b"\x00"
        sock.sendto(struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0) + name + b"\x00\x01\x00\x01", (SERVER, 53))
        sock.recvfrom(512)
        time.sleep(0.05)
    sock.close()


def _web(root: Path, port: int, tls: Path | None) -> http.server.ThreadingHTTPServer:
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root))  # noqa: E731
    http.server.SimpleHTTPRequestHandler.protocol_version = "HTTP/1.1"  # keep-alive, like browsers and clients
    srv = http.server.ThreadingHTTPServer((SERVER, port), handler)
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls / "cert.pem", tls / "key.pem")
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return srv


def test_ssh_tls_http_dns_is_no_training_job(tmp_path: Path) -> None:
    www = tmp_path / "www"
    www.mkdir()
    (www / "model.bin").write_bytes(os.urandom(1 << 20))
    (www / "index.html").write_bytes(b"<html>" + b"x" * 20_000 + b"</html>")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=web",
                    "-keyout", tmp_path / "key.pem", "-out", tmp_path / "cert.pem"], check=True, capture_output=True)
    pcap = tmp_path / "office.pcap"
    dump = subprocess.Popen(["tcpdump", "-i", "lo", "-U", "-s", "128", "-w", str(pcap),
                             f"host {SERVER} and (host {CLIENTS[0]} or host {CLIENTS[1]})"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    servers = [threading.Thread(target=f, args=(stop,), daemon=True) for f in (_serve_ssh, _serve_dns)]
    webs = [_web(www, 80, None), _web(www, 443, tmp_path)]
    try:
        time.sleep(1.0)  # tcpdump is listening
        for t in servers:
            t.start()
        time.sleep(0.2)
        urls = [f"https://{SERVER}/model.bin"] * 12 + [f"http://{SERVER}/index.html"] * 6
        curls = [subprocess.Popen(["curl", "-sk", "--interface", src, "-o", "/dev/null", *(u for u in urls for _ in (0,)),
                                   "--rate", "8/s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for src in CLIENTS]
        work = [threading.Thread(target=f, args=(src,)) for src in CLIENTS for f in (_ssh_client, _dns_client)]
        for t in work:
            t.start()
        for t in work:
            t.join(timeout=60)
        for c in curls:
            assert c.wait(timeout=60) == 0
        time.sleep(0.5)
    finally:
        stop.set()
        for w in webs:
            w.shutdown()
        dump.send_signal(signal.SIGINT)
        dump.wait(timeout=10)
    proc = run_cli("capture", "--read", pcap, "--out", tmp_path / "t")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "no training job found" in out, out
    for service in ("ssh", "tls", "http", "dns"):
        assert service in out, out
    loc = run_cli("localize", tmp_path / "t", "--flows")
    assert loc.returncode == 2 and "no training job found" in loc.stderr and "Traceback" not in loc.stderr
