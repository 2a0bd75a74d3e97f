"""An upload's hidden file left by a web process that died mid-upload is removed when its
folder is next listed, once nobody has written to it for STALE_UPLOAD seconds; a live upload's
file, and names that only look alike, stay."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from files_app.services import STALE_UPLOAD, UPLOAD_MARK
from tests.files import places
from tests.files.places import owned_by
from tests.files.test_files_api import as_user, listed

pytestmark = [pytest.mark.slurm]
people = places.people
workspace = places.workspace


def planted(folder: Path, name: bytes, *, age: float) -> Path:
    path = Path(os.fsdecode(os.fsencode(folder) + b"/" + name))
    path.write_bytes(b"part of an upload")
    owned_by(path)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_listing_a_folder_removes_the_uploads_abandoned_there_and_nothing_else(
    people: dict[str, User], workspace: Path
) -> None:
    mark = UPLOAD_MARK + secrets.token_hex(8).encode()
    abandoned = planted(workspace, b".data.bin" + mark, age=STALE_UPLOAD + 60)
    odd_abandoned = planted(workspace, b".caf\xe9\nx" + mark, age=STALE_UPLOAD + 60)
    under_way = planted(workspace, b".live.bin" + mark, age=60)
    look_alike = planted(workspace, b".notes" + UPLOAD_MARK + b"mine", age=STALE_UPLOAD + 60)
    visible = planted(workspace, b"data.bin" + mark, age=STALE_UPLOAD + 60)

    names = {entry["name"] for entry in listed(as_user(people["alice"]), workspace)["entries"]}

    assert not abandoned.exists()
    assert not odd_abandoned.exists()
    assert under_way.exists() and under_way.name in names
    assert look_alike.exists() and look_alike.name in names
    assert visible.exists() and visible.name in names
    assert abandoned.name not in names


def test_an_abandoned_upload_the_account_may_not_remove_stays_listed(
    people: dict[str, User], workspace: Path
) -> None:
    theirs = workspace / "theirs"
    theirs.mkdir()
    owned_by(theirs, "pwbob")
    stuck = planted(theirs, b".x" + UPLOAD_MARK + b"0123456789abcdef", age=STALE_UPLOAD + 60)
    owned_by(stuck, "pwbob")
    theirs.chmod(0o755)  # pwalice may read the folder, not change it

    names = {entry["name"] for entry in listed(as_user(people["alice"]), theirs)["entries"]}

    assert stuck.exists() and stuck.name in names
