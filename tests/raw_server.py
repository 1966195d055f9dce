"""A judge endpoint that never helps, as a real TCP server on loopback (plain sockets, no HTTP library between the
test and the bytes): ``silent`` reads every request and never answers (a wedged judge); ``500`` answers every
request with an HTTP 500. Used by the judge-health tests and the stop drill."""

from __future__ import annotations

import socket
import threading
import time

MODES = ("silent", "500")


class RawServer:
    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"RawServer mode {mode!r}: one of {MODES}")
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.requests = 0
        self.lines: list[str] = []  # each whole request's first line ("POST /v1/chat/completions HTTP/1.1")
        self.first_at: float | None = None  # monotonic time the first whole request was read
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
                head, sep, body = buf.partition(b"\r\n\r\n")
                if not sep:
                    continue
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if len(body) < length:
                    continue
                buf = body[length:]
                self.requests += 1
                self.lines.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
                self.first_at = self.first_at or time.monotonic()
                if self.mode == "500":
                    msg = b'{"error": {"message": "the judge is broken", "type": "server_error"}}'
                    conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg))
                # silent: the request was read; nothing is ever sent back
        except OSError:
            return

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
