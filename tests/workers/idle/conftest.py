from __future__ import annotations

from tests.workers.api.fixtures import (  # noqa: F401 - fixtures are found by name
    api,
    api_key,
    cluster,
    compute_env,
)
