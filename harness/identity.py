"""The tests' identity services: the OpenID provider of scripts/idp (oidc-provider under Node.js,
started per test session or per test on a free port) and the LDAP directory of
scripts/directory.sh; and the steps a person takes on the provider's pages, by script.

The provider's pages (scripts/README.md): the login page at /interaction/<uid> (fields `login`,
`password`, button "Sign in"; "Wrong login or password" on failure), the device flow's code and
confirm pages, and the sign-out page (form `op.logoutForm`, button "Yes, sign me out").
"""

# The test people's passwords are published on purpose (scripts/README.md), and OAuth's field
# names say "secret" and "password" where none is: ruff's hard-coded password checks do not apply.
# ruff: noqa: S105, S106

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import IO, Any
from urllib.parse import urljoin

import httpx

from harness import REPO, HarnessError
from harness.cluster import read_cluster_env
from harness.platform import free_port

IDP_DIR = REPO / "scripts" / "idp"
PROVIDER_SCRIPT = IDP_DIR / "provider.mjs"
DIRECTORY_SCRIPT = REPO / "scripts" / "directory.sh"
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
NO_PROVIDER = "no OpenID provider: run `make identity` (make test does)"
NO_DIRECTORY = "no test directory: run `scripts/directory.sh up` (make test does)"
WRONG_PASSWORD = "Wrong login or password"


@dataclass(frozen=True)
class IdentityUser:
    """A person of the provider: what they type on its login page and the claims it hands out
    (``sub``, ``preferred_username``, ``name``, ``email``, ``groups``)."""

    login: str
    password: str
    claims: Mapping[str, Any]

    @property
    def sub(self) -> str:
        return str(self.claims["sub"])

    @property
    def preferred_username(self) -> str:
        return str(self.claims["preferred_username"])

    def config(self) -> dict[str, Any]:
        return {"login": self.login, "password": self.password, "claims": dict(self.claims)}


# The single-sign-on person of the test cluster (Unix account pwcarol): their name at the
# provider is mixed case on purpose, so a naming rule has something to do.
CAROL = IdentityUser(
    login="carol",
    password="carol-pass-1",
    claims={
        "sub": "carol-0001",
        "preferred_username": "PWCarol",
        "name": "Carol Sign-On",
        "email": "carol@activate.test",
        "email_verified": True,
        "groups": ["hpc-users"],
    },
)
# Someone else of the same site, with no account on the test cluster and none of its groups.
FRANK = IdentityUser(
    login="frank",
    password="frank-pass-1",
    claims={
        "sub": "frank-0002",
        "preferred_username": "frank.other",
        "name": "Frank Other",
        "email": "frank@activate.test",
        "email_verified": True,
        "groups": ["other"],
    },
)
DEFAULT_USERS = (CAROL, FRANK)


@dataclass(frozen=True)
class Client:
    """A client registered at the provider: confidential when it has a secret, public when not."""

    client_id: str
    client_secret: str | None = None
    redirect_uris: tuple[str, ...] = ()
    post_logout_redirect_uris: tuple[str, ...] = ()
    grant_types: tuple[str, ...] = ("authorization_code",)

    def metadata(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "client_id": self.client_id,
            "client_name": self.client_id,
            "grant_types": list(self.grant_types),
            "redirect_uris": list(self.redirect_uris),
            "post_logout_redirect_uris": list(self.post_logout_redirect_uris),
            "response_types": ["code"] if "authorization_code" in self.grant_types else [],
        }
        if self.client_secret is None:
            data["token_endpoint_auth_method"] = "none"
        else:
            data["client_secret"] = self.client_secret
            data["token_endpoint_auth_method"] = "client_secret_basic"
        return data


def web_client(
    redirect_uri: str = "http://127.0.0.1:8000/oidc/callback/",
    *,
    post_logout_redirect_uri: str = "http://127.0.0.1:8000/",
    client_id: str = "activate-web",
) -> Client:
    """The platform's web login: authorization code with PKCE, a fresh secret each time."""
    return Client(
        client_id=client_id,
        client_secret=secrets.token_urlsafe(24),
        redirect_uris=(redirect_uri,),
        post_logout_redirect_uris=(post_logout_redirect_uri,),
    )


def cli_client(client_id: str = "activate-cli") -> Client:
    """`pw auth login`: public, device authorization grant and refresh tokens."""
    return Client(client_id=client_id, grant_types=(DEVICE_GRANT, "refresh_token"))


@dataclass
class Provider:
    """A running provider. ``web`` and ``cli`` are the first confidential and the first public
    client it was started with."""

    issuer: str
    port: int
    users: tuple[IdentityUser, ...]
    clients: tuple[Client, ...]
    workdir: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def web(self) -> Client:
        return next(c for c in self.clients if c.client_secret is not None)

    @property
    def cli(self) -> Client:
        return next(c for c in self.clients if c.client_secret is None)

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    @property
    def jwks_uri(self) -> str:
        return f"{self.issuer}/jwks"

    @property
    def log_path(self) -> Path:
        return self.workdir / "provider.log"

    def discovery(self) -> dict[str, Any]:
        response = httpx.get(self.discovery_url, timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def user(self, login: str) -> IdentityUser:
        return next(u for u in self.users if u.login == login)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Provider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (IDP_DIR / "node_modules" / "oidc-provider").is_dir():
        raise HarnessError(NO_PROVIDER)
    return node


def _read_ready(stdout: IO[bytes], found: list[str]) -> None:
    for raw in stdout:
        line = raw.decode(errors="replace").strip()
        if line.startswith("READY "):
            found.append(line.removeprefix("READY "))
            return


def start_provider(
    users: Sequence[IdentityUser] = DEFAULT_USERS,
    clients: Sequence[Client] | None = None,
    *,
    timeout: float = 60,
) -> Provider:
    """Start scripts/idp/provider.mjs on a free loopback port (over plain http) with ``users``
    and ``clients`` (default: `web_client()` and `cli_client()`), and wait until it listens.
    Tried twice: the free port may be taken by another test's server before the provider
    binds it."""
    clients = tuple(clients) if clients is not None else (web_client(), cli_client())
    try:
        return _start_provider_once(users, clients, timeout)
    except HarnessError as first:
        try:
            return _start_provider_once(users, clients, timeout)
        except HarnessError as second:
            raise HarnessError(f"{second}\n(the first attempt: {first})") from None


def _start_provider_once(
    users: Sequence[IdentityUser], clients: tuple[Client, ...], timeout: float
) -> Provider:
    node = _node()
    started = time.monotonic()
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="activate-idp-"))
    config = workdir / "provider.json"
    config.write_text(
        json.dumps(
            {
                "port": port,
                "issuer": issuer,
                "clients": [c.metadata() for c in clients],
                "users": [u.config() for u in users],
            }
        )
    )
    config.chmod(0o600)
    with (workdir / "provider.log").open("ab") as log:
        process = subprocess.Popen(
            [node, str(PROVIDER_SCRIPT), str(config)],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            cwd=IDP_DIR,
        )
    provider = Provider(issuer, port, tuple(users), clients, workdir, process)
    assert process.stdout is not None
    found: list[str] = []
    reader = threading.Thread(target=_read_ready, args=(process.stdout, found), daemon=True)
    reader.start()
    reader.join(timeout)
    if found != [issuer]:
        code = process.poll()
        # Read before stopping: stop() removes the folder the log is in.
        log_text = provider.log_path.read_text(errors="replace")[-2000:]
        provider.stop()
        how = f"exited with {code}" if code is not None else "still silent"
        raise HarnessError(
            f"the OpenID provider on port {port} did not start within "
            f"{time.monotonic() - started:.1f} s ({how}): {log_text}"
        )
    return provider


@contextmanager
def running_provider(
    users: Sequence[IdentityUser] = DEFAULT_USERS, clients: Sequence[Client] | None = None
) -> Iterator[Provider]:
    provider = start_provider(users, clients)
    try:
        yield provider
    finally:
        provider.stop()


# -- the provider's pages, by script ---------------------------------------------------------


@dataclass
class Form:
    action: str
    fields: dict[str, str]
    form_id: str | None = None


class _Forms(HTMLParser):
    """Forms and their named inputs; inputs outside a form join it by their `form` attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[Form] = []
        self._open: Form | None = None
        self._outside: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag == "form":
            self._open = Form(values.get("action", ""), {}, values.get("id"))
            self.forms.append(self._open)
        elif tag == "input" and values.get("name"):
            if values.get("type") in ("submit", "button"):
                return
            if "form" in values:
                self._outside.append((values["form"], values["name"], values.get("value", "")))
            elif self._open is not None:
                self._open.fields[values["name"]] = values.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._open = None

    def close(self) -> None:
        super().close()
        for form_id, name, value in self._outside:
            for form in self.forms:
                if form.form_id == form_id:
                    form.fields[name] = value


def forms_of(response: httpx.Response) -> list[Form]:
    """The page's forms, their actions made absolute."""
    parser = _Forms()
    parser.feed(response.text)
    parser.close()
    for form in parser.forms:
        form.action = urljoin(str(response.url), form.action or str(response.url))
    return parser.forms


def _form(response: httpx.Response, *, has: str | None = None, form_id: str | None = None) -> Form:
    for form in forms_of(response):
        if (has is None or has in form.fields) and (form_id is None or form.form_id == form_id):
            return form
    raise HarnessError(f"no such form on {response.url} ({response.status_code}): {response.text}")


def follow_on_provider(http: httpx.Client, response: httpx.Response) -> httpx.Response:
    """Follow redirects while they stay on the provider's origin: the result is a page of the
    provider, or the redirect that leaves it (to the client's redirect URI, with ``code`` and
    ``state``; or to its post-logout URI), not followed."""
    origin = response.request.url.copy_with(path="/", query=None, fragment=None)
    while response.is_redirect:
        target = response.request.url.join(response.headers["location"])
        if target.copy_with(path="/", query=None, fragment=None) != origin:
            break
        response = http.get(target)
    return response


def sign_in(http: httpx.Client, login_page: httpx.Response, user: IdentityUser) -> httpx.Response:
    """Submit the provider's login page (the response that shows it) as ``user``; see
    `follow_on_provider` for what comes back. A wrong password gives the login page again,
    with "Wrong login or password"."""
    form = _form(login_page, has="login")
    data = {**form.fields, "login": user.login, "password": user.password}
    return follow_on_provider(http, http.post(form.action, data=data))


def complete_device_flow(
    verification_uri_complete: str, user: IdentityUser, *, timeout: float = 30
) -> httpx.Response:
    """What a person does with the link `pw auth login` shows: open it, confirm the code, sign
    in. Returns the provider's last page ("Device signed in" on success)."""
    with httpx.Client(timeout=timeout) as http:
        # The link posts the code itself (a page that submits its form on load).
        page = follow_on_provider(http, http.get(verification_uri_complete))
        posted = _form(page, has="user_code")
        confirm_page = follow_on_provider(http, http.post(posted.action, data=posted.fields))
        confirm = _form(confirm_page, has="confirm")
        login_page = follow_on_provider(http, http.post(confirm.action, data=confirm.fields))
        done = sign_in(http, login_page, user)
        if "Device signed in" not in done.text:
            raise HarnessError(f"the device flow did not complete: {done.text[-1000:]}")
        return done


def sign_out(http: httpx.Client, end_session_url: str) -> httpx.Response:
    """RP-initiated logout by script: open the provider's end-session URL (with the client's
    `id_token_hint`, `post_logout_redirect_uri`, `state`), answer "Yes, sign me out" (POST the
    page's `op.logoutForm`, its `xsrf` and `logout=yes`). Returns the redirect to the
    post-logout URI (not followed), or the provider's "Signed out" page when none was given."""
    page = follow_on_provider(http, http.get(end_session_url))
    form = _form(page, form_id="op.logoutForm")
    data = {**form.fields, "logout": "yes"}
    return follow_on_provider(http, http.post(form.action, data=data))


# -- the directory ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DirectoryPerson:
    uid: str
    password: str
    groups: tuple[str, ...]


# scripts/directory.sh's seed.
DAVE = DirectoryPerson("pwdave", "dave-pass-1", ("hpc-users",))
ERIN = DirectoryPerson("pwerin", "erin-pass-1", ("gpu-users",))


@dataclass(frozen=True)
class DirectorySettings:
    url: str
    base_dn: str
    people_dn: str
    groups_dn: str
    bind_dn: str
    bind_password: str = field(repr=False)

    def person_dn(self, uid: str) -> str:
        return f"uid={uid},{self.people_dn}"

    def group_dn(self, cn: str) -> str:
        return f"cn={cn},{self.groups_dn}"


def directory_settings() -> DirectorySettings:
    """The running directory as `scripts/directory.sh env`'s file says (ACTIVATE_TEST_LDAP_*)."""
    env_file = Path(
        subprocess.run(
            ["bash", str(DIRECTORY_SCRIPT), "env"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    )
    values: dict[str, str] = {}
    with suppress(OSError):
        for line in env_file.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                values[key.strip()] = value.strip()
    if "ACTIVATE_TEST_LDAP_URL" not in values:
        raise HarnessError(NO_DIRECTORY)
    return DirectorySettings(
        url=values["ACTIVATE_TEST_LDAP_URL"],
        base_dn=values["ACTIVATE_TEST_LDAP_BASE_DN"],
        people_dn=values["ACTIVATE_TEST_LDAP_PEOPLE_DN"],
        groups_dn=values["ACTIVATE_TEST_LDAP_GROUPS_DN"],
        bind_dn=values["ACTIVATE_TEST_LDAP_BIND_DN"],
        bind_password=values["ACTIVATE_TEST_LDAP_BIND_PASSWORD"],
    )


# -- the test sshd's user certificate authorities ---------------------------------------------

USER_CA_KEYS_LOCK = Path("/run/activate-user-ca-keys.lock")


def user_ca_keys_path() -> Path:
    """The CA public keys the test sshd trusts (its TrustedUserCAKeys, scripts/testcluster.sh)."""
    return Path(
        read_cluster_env().get("ACTIVATE_TEST_USER_CA_KEYS", "/etc/ssh/activate_test_user_ca_keys")
    )


def _edit_user_ca_keys(edit: Callable[[list[str]], list[str]]) -> None:
    # Tests in other processes edit it too, and sshd reads it at every login: one writer at a
    # time, and the new file replaces the old whole.
    path = user_ca_keys_path()
    with USER_CA_KEYS_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lines = path.read_text().splitlines() if path.exists() else []
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text("".join(f"{line}\n" for line in edit(lines)))
        tmp.chmod(0o644)
        os.replace(tmp, path)


@contextmanager
def trusted_user_ca(public_key: str) -> Iterator[None]:
    """The test sshd accepts user certificates signed by the CA of ``public_key`` (one
    `ssh-ed25519 AAAA...` line) while inside; needs root, as make test runs."""
    line = public_key.strip()

    def without_one(lines: list[str]) -> list[str]:
        if line in lines:
            lines.remove(line)
        return lines

    _edit_user_ca_keys(lambda lines: [*lines, line])
    try:
        yield
    finally:
        _edit_user_ca_keys(without_one)
