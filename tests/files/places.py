"""What the files tests share: a per-user cluster on the test cluster's sshd with alice acting as
pwalice and bob as pwbob (homes 0700, each closed to the other), and a folder of a test's own
in pwalice's home, made and read here as root on the same machine."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User

from harness.cluster import SshTarget
from workers_app.actions import cluster_accounts as accounts
from workers_app.models import Cluster

CLUSTER = "files-per-user"


def people_on(cluster: Cluster, ssh_target: SshTarget) -> dict[str, User]:
    """alice (pwalice) and bob (pwbob) with verified accounts, in the cluster's lab group; carol,
    outside the lab, sees no such cluster; dave is in the lab with no account there."""
    users = get_user_model().objects
    people = {
        name: users.create_user(name, password=f"pw-{name}-123")
        for name in ("alice", "bob", "carol", "dave")
    }
    lab = Group.objects.create(name="files-lab")
    lab.user_set.add(people["alice"], people["bob"], people["dave"])
    cluster.allowed_groups.add(lab)
    for name, remote in (("alice", "pwalice"), ("bob", "pwbob")):
        key = Path(ssh_target.accounts[remote]).read_text()
        account = accounts.connect_account(
            people[name], cluster, remote_username=remote, private_key=key
        )
        assert accounts.verify_account(account), account.last_error
    return people


@pytest.fixture
def people(make_cluster: Any, ssh_target: SshTarget) -> dict[str, User]:
    cluster: Cluster = make_cluster(name=CLUSTER, shared=False)
    return people_on(cluster, ssh_target)


def owned_by(path: Path, user: str = "pwalice") -> Path:
    entry = pwd.getpwnam(user)
    os.lchown(path, entry.pw_uid, entry.pw_gid)
    return path


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A folder of the test's own in pwalice's home (other tests use that home too)."""
    folder = Path("/home/pwalice") / f"files-{secrets.token_hex(4)}"
    folder.mkdir()
    owned_by(folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
