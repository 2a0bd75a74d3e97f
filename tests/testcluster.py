"""Where the test cluster is (scripts/testcluster.sh): for tests, benchmarks and drills."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLUSTER_ENV = REPO / ".cluster" / "cluster.env"
NOT_UP = "no test cluster: run `scripts/testcluster.sh up` (make test does)"


@dataclass(frozen=True)
class SshTarget:
    host: str
    port: int
    user: str
    key_path: str
    host_key: str
    partition: str

    @property
    def private_key(self) -> str:
        return Path(self.key_path).read_text()


def read_cluster_env() -> dict[str, str]:
    values = {k: v for k, v in os.environ.items() if k.startswith("ACTIVATE_TEST_")}
    if CLUSTER_ENV.exists():
        for line in CLUSTER_ENV.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                values.setdefault(key.strip(), value.strip())
    return values


def target_fields() -> dict[str, str | int] | None:
    """The SshTarget fields of the running test cluster, or None when it is not up."""
    values = read_cluster_env()
    if "ACTIVATE_TEST_SSH_HOST" not in values:
        return None
    return {
        "host": values["ACTIVATE_TEST_SSH_HOST"],
        "port": int(values["ACTIVATE_TEST_SSH_PORT"]),
        "user": values["ACTIVATE_TEST_SSH_USER"],
        "key_path": values["ACTIVATE_TEST_SSH_KEY"],
        "host_key": values["ACTIVATE_TEST_SSH_HOST_KEY"],
        "partition": values.get("ACTIVATE_TEST_SLURM_PARTITION", "debug"),
    }
