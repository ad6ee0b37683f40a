"""A webhook receiver for the live demo (docker-compose.yml, profile ``demo``): logs one line
per page it receives (event, severity, summary) and answers 200. Standard library only.

    python infra/demo/receiver.py [PORT [HOST]]    # default 8080 on all interfaces (a container)
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            page = json.loads(body)
            line = (f"page {page.get('event', '?')} [{page.get('severity', '?')}] "
                    f"{page.get('summary') or page.get('text') or ''}")
        except (ValueError, AttributeError):
            line = f"page (not JSON, {len(body)} bytes)"
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"{stamp} {self.path} {line}", flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 - a health check
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per page (above) is the log


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    host = sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0"  # noqa: S104 - in a container
    server = ThreadingHTTPServer((host, port), Handler)
    print(f"webhook receiver listening on {host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
