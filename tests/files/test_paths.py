"""Paths as the API carries them, and a download's name as browsers read it: no cluster."""

from __future__ import annotations

import base64

import pytest

from core.errors import ParameterError
from files_app import paths
from files_app.transfers import content_disposition


@pytest.mark.parametrize(
    "raw", [b"/home/a", b"caf\xe9\xff", b"new\nline", b"-rf 'x' \"y\"", "ü/ß".encode()]
)
def test_any_bytes_go_there_and_back_as_base64(raw: bytes) -> None:
    encoded = paths.b64(raw)

    assert paths.path_from({"path_b64": encoded}) == raw
    assert paths.path_from({"path_b64": encoded.rstrip("=")}) == raw  # padding optional
    assert base64.urlsafe_b64decode(encoded) == raw


def test_a_string_path_is_its_utf8_and_the_b64_form_wins() -> None:
    assert paths.path_from({"path": "/tmp/ü"}) == "/tmp/ü".encode()
    assert paths.path_from({"path": "/a", "path_b64": paths.b64(b"/b")}) == b"/b"
    assert paths.path_from({"from": "/x"}, "from") == b"/x"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "path"),
        ({"path_b64": "%%%"}, "path_b64"),
        ({"path_b64": paths.b64(b"a\0b")}, "path_b64"),
        ({"path": "a\0b"}, "path"),
        ({"path": "x" * 5000}, "path"),
        ({"path": 7}, "path"),
    ],
)
def test_bad_paths_are_refused_naming_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ParameterError) as refused:
        paths.path_from(data)
    assert refused.value.field == field


def test_display_names_replace_what_is_no_utf8_and_parents_stop_at_the_root() -> None:
    assert paths.display(b"caf\xe9") == "caf\ufffd"
    assert paths.parent_of(b"/home/a/") == b"/home"
    assert paths.parent_of(b"/home") == b"/"
    assert paths.parent_of(b"/") is None
    assert paths.join(b"/", b"x") == b"/x"


def test_a_downloads_name_is_offered_in_utf8_with_an_ascii_stand_in() -> None:
    header = content_disposition(b'r\xc3\xa9sum\xc3\xa9 "final"\n\xff.pdf').decode()

    assert header == (
        'attachment; filename="r_sum_ _final___.pdf"; '
        "filename*=UTF-8''r%C3%A9sum%C3%A9%20%22final%22%0A%EF%BF%BD.pdf"
    )
