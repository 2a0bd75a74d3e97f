"""Where `pw ssh` opens its terminal: the platform's address, as a WebSocket URL."""

from __future__ import annotations

import pytest
from activate_cli.ssh import terminal_url


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/ws/workers/w1/terminal/"),
        ("https://hpc.example.org", "wss://hpc.example.org/ws/workers/w1/terminal/"),
        ("https://example.org/activate/", "wss://example.org/activate/ws/workers/w1/terminal/"),
    ],
)
def test_the_terminal_url_follows_the_platform_address(host: str, url: str) -> None:
    assert terminal_url(host, "w1") == url


def test_a_worker_id_cannot_escape_its_path() -> None:
    assert terminal_url("http://h", "../admin") == "ws://h/ws/workers/..%2Fadmin/terminal/"
