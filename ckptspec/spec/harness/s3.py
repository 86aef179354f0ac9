"""A real S3 HTTP endpoint on loopback (moto's server mode), a fault-injecting proxy in front of it, and the
Multi-Storage Client config file that points MSC profiles at them.

Everything runs in threads of the test process and binds 127.0.0.1 on ports the kernel picks. Rank processes
reach the endpoint over HTTP through MSC's own s3 provider; nothing in MSC is patched.

The fixture `s3` is the one endpoint fixture of every suite: a conftest imports it. moto and boto3 are imported
only when an endpoint starts, so importing this module costs nothing where no test asks for one.
"""

from __future__ import annotations

import http.client
import http.server
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = ["BUCKET", "FaultProxy", "S3Endpoint", "s3", "start_endpoint"]

BUCKET = "ckpt"
MISSING_BUCKET = "no-such-bucket"
CREDENTIALS = {"access_key": "testing", "secret_key": "testing"}
REGION = "us-east-1"
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}


class FaultProxy:
    """HTTP proxy to the S3 endpoint that fails requests as the test asks.

    - `fail_puts(status, suffix)`: answer `status` (an S3 XML error) to every PUT whose path ends with `suffix`;
    - `die_after_puts(n)`: forward `n` PUTs, then act as a server that went away: every later request has its
      connection closed without an answer;
    - `heal()`: forward everything again.
    """

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self._lock = threading.Lock()
        self._fail: tuple[int, str] | None = None
        self._puts_left: int | None = None
        self._dead = False
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def fail_puts(self, status: int, suffix: str) -> None:
        with self._lock:
            self._fail = (status, suffix)

    def die_after_puts(self, n: int) -> None:
        with self._lock:
            self._puts_left = n

    def heal(self) -> None:
        with self._lock:
            self._fail, self._puts_left, self._dead = None, None, False

    def _decide(self, method: str, path: str) -> str | int:
        """'forward', 'die', or the HTTP status to answer with."""
        with self._lock:
            if self._dead:
                return "die"
            if method != "PUT":
                return "forward"
            if self._fail is not None and path.split("?")[0].endswith(self._fail[1]):
                return self._fail[0]
            if self._puts_left == 0:
                self._dead = True
                return "die"
            if self._puts_left is not None:
                self._puts_left -= 1
            return "forward"

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def _handle(self) -> None:
                body = self._body()
                decision = proxy._decide(self.command, self.path)
                if decision == "die":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif decision == "forward":
                    self._forward(body)
                else:
                    self._answer(
                        int(decision),  # an HTTP status
                        b"<?xml version='1.0'?><Error><Code>ServiceUnavailable</Code>"
                        b"<Message>injected by the test's fault proxy</Message></Error>",
                    )

            def _forward(self, body: bytes) -> None:
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                payload = response.read()
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_BY_HOP and (key.lower() != "content-length" or self.command == "HEAD"):
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                upstream.close()

            def _answer(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        return Handler


@dataclass
class S3Endpoint:
    """The running endpoint: MSC_CONFIG path, the proxy, and a boto3 client straight to the server."""

    config_path: str
    url: str
    proxy: FaultProxy
    client: Any  # a boto3 S3 client (boto3 has no type information)

    def keys(self, prefix: str) -> list[str]:
        """Object keys under `prefix` in the bucket, read directly (not through the proxy)."""
        listing = self.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for o in listing.get("Contents", []))


def _profile(endpoint_url: str, bucket: str, *, timeout: float) -> str:
    return f"""
    storage_provider:
      type: s3
      options:
        base_path: {bucket}
        endpoint_url: {endpoint_url}
        region_name: {REGION}
        connect_timeout: {timeout}
        read_timeout: {timeout}
        retries: {{total_max_attempts: 1, mode: standard}}
        request_checksum_calculation: when_required
    credentials_provider:
      type: S3Credentials
      options:
        access_key: {CREDENTIALS["access_key"]}
        secret_key: {CREDENTIALS["secret_key"]}
    retry:
      attempts: 1
      delay: 0
"""


def start_endpoint(config_path: str) -> tuple[S3Endpoint, Callable[[], None]]:
    """Start moto and the proxy, create the bucket, write the MSC config; returns (S3Endpoint, stop function).

    Profiles: `s3` (straight to the server), `s3-faulty` (through the fault proxy) and `s3-missing` (a bucket
    that does not exist). Retries are off and timeouts short, so failures surface at once.
    """
    import boto3
    from moto.server import ThreadedMotoServer

    werkzeug_logger = logging.getLogger("werkzeug")
    previous_level = werkzeug_logger.level
    werkzeug_logger.setLevel(logging.ERROR)  # moto's server logs every request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id=CREDENTIALS["access_key"],
        aws_secret_access_key=CREDENTIALS["secret_key"],
    )
    client.create_bucket(Bucket=BUCKET)  # also proves the server answers
    proxy = FaultProxy(port)
    proxy.start()
    with open(config_path, "w") as f:
        f.write(
            "profiles:\n"
            f"  s3:{_profile(url, BUCKET, timeout=10)}"
            f"  s3-faulty:{_profile(f'http://127.0.0.1:{proxy.port}', BUCKET, timeout=5)}"
            f"  s3-missing:{_profile(url, MISSING_BUCKET, timeout=5)}"
        )

    def stop() -> None:
        proxy.stop()
        server.stop()
        werkzeug_logger.setLevel(previous_level)

    return S3Endpoint(config_path, url, proxy, client), stop


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """A running S3 endpoint for the module; ranks get its MSC config file (`s3.config_path`) as MSC_CONFIG."""
    endpoint, stop = start_endpoint(str(tmp_path_factory.mktemp("msc") / "msc_config.yaml"))
    yield endpoint
    stop()
