"""The platform's REST API, with every failure turned into one sentence for the user."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import httpx

from activate_cli.config import Config
from activate_cli.errors import CliError, NotFound, Unreachable

PAGE_SIZE = 100
TIMEOUT_SECONDS = 30.0
USER_AGENT = "pw/0.1"
POST_ATTEMPTS = 3
RETRY_BASE_DELAY = 0.5


def _detail(response: httpx.Response) -> tuple[str | None, str]:
    try:
        body = response.json()
    except ValueError:
        return None, ""
    if not isinstance(body, dict):
        return None, ""
    field = body.get("field")
    return (str(field) if field else None), str(body.get("detail") or "")


class ApiClient:
    def __init__(self, config: Config, *, transport: httpx.BaseTransport | None = None) -> None:
        self.host = config.platform_host
        self.api_key = config.api_key
        self._http = httpx.Client(
            base_url=f"{self.host}/api",
            # No key yet (`pw auth login` asking how to sign in): no Authorization at all.
            headers={"User-Agent": USER_AGENT}
            | ({"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}),
            timeout=TIMEOUT_SECONDS,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(
        self, path: str, *, params: Mapping[str, Any] | None = None, not_found: str = ""
    ) -> Any:
        return self.request("GET", path, params=params, not_found=not_found)

    def post(
        self,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        not_found: str = "",
        idempotency_key: str = "",
    ) -> Any:
        """POST; with an idempotency key, retried when the answer is lost or a 5xx, since the
        server makes nothing twice for one key."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        attempts = POST_ATTEMPTS if idempotency_key else 1
        for attempt in range(attempts):
            try:
                return self.request("POST", path, json=body, headers=headers, not_found=not_found)
            except Unreachable:
                if attempt == attempts - 1:
                    raise
                time.sleep(RETRY_BASE_DELAY * 2**attempt)
        return None

    def delete(self, path: str, *, not_found: str = "") -> Any:
        return self.request("DELETE", path, not_found=not_found)

    def list_all(
        self, path: str, *, params: Mapping[str, Any] | None = None, not_found: str = ""
    ) -> list[Any]:
        """Every item of a paginated list, page by page."""
        items: list[Any] = []
        while True:
            query = {**(params or {}), "limit": PAGE_SIZE, "offset": len(items)}
            page = self.get(path, params=query, not_found=not_found)
            results = page.get("results", []) if isinstance(page, dict) else []
            items += results
            if not results or len(items) >= int(page.get("count", 0)):
                return items

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        not_found: str = "",
    ) -> Any:
        try:
            response = self._http.request(method, path, params=params, json=json, headers=headers)
        except httpx.TimeoutException:
            raise Unreachable(f"{self.host} did not answer within {TIMEOUT_SECONDS:g} s") from None
        except httpx.HTTPError as exc:
            raise Unreachable(f"cannot reach {self.host} ({exc})") from None
        return self._result(response, not_found=not_found)

    def _result(self, response: httpx.Response, *, not_found: str) -> Any:
        code = response.status_code
        field, detail = _detail(response)
        if code == 401:
            raise CliError(
                f"{self.host} refused the API key ({detail or 'HTTP 401'}); "
                "check PW_API_KEY or run `pw auth login`"
            )
        if code == 404:
            raise NotFound(not_found or detail or f"not found: {response.url}")
        if code >= 500:
            raise Unreachable(f"{self.host} failed with HTTP {code}; try again later")
        if code >= 400:
            message = detail or f"HTTP {code} from {response.url}"
            raise CliError(f"{field}: {message}" if field else message)
        if 300 <= code < 400:
            # Not followed: the key would go wherever the redirect points.
            target = response.headers.get("Location", "elsewhere")
            raise CliError(f"{self.host} redirects to {target}; set the platform host to that URL")
        if code == 204:
            return None
        try:
            return response.json()
        except ValueError:
            raise CliError(
                f"unexpected answer from {response.url} (not JSON): is {self.host} an "
                "ACTIVATE platform?"
            ) from None
