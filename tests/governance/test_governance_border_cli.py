"""`gateway keys` against what is not the gateway's admin API: a server answering HTML (a proxy's
page) and an admin key httpx cannot send (non-ASCII) end in one line and an exit status, never a
traceback, and the key is not echoed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli_app


class _Html(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = b"<html>sign in</html>"
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def html_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "args",
    [
        ["keys", "list"],
        ["keys", "create", "--tenant", "t"],
        ["keys", "revoke", "mk_0000000000000000"],
        ["keys", "rotate", "mk_0000000000000000"],
    ],
)
def test_a_non_json_answer_is_one_line_not_a_traceback(html_server: str, args: list[str]) -> None:
    out = CliRunner().invoke(cli_app, [*args, "--url", html_server, "--admin-key", "adm-SECRET-1"])
    assert out.exit_code == 1, out.output
    assert out.exception is None or isinstance(out.exception, SystemExit)
    assert "did not answer JSON" in out.output and "SECRET" not in out.output


def test_an_admin_key_that_cannot_be_sent_is_refused_without_showing_it(html_server: str) -> None:
    out = CliRunner().invoke(
        cli_app, ["keys", "list", "--url", html_server, "--admin-key", "adm-SECRET-é€"]
    )
    assert out.exit_code == 2, out.output
    assert out.exception is None or isinstance(out.exception, SystemExit)
    assert "printable ASCII" in out.output and "SECRET" not in out.output
