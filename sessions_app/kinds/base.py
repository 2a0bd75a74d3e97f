"""What a session kind declares: how its program starts on the node, when it is ready, and how
the platform's proxy logs the browser in to it. One module per kind in this package."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Protocol

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from core.env import EnvReader
from core.errors import ParameterError
from node import starter_source
from sessions_app.catalog.spec import FieldSpec

Headers = list[tuple[bytes, bytes]]


class Session(Protocol):
    """What a kind reads of a session (the model satisfies it; kinds need not import it)."""

    @property
    def name(self) -> str: ...
    def secret(self) -> str: ...
    @property
    def url_path(self) -> str: ...
    @property
    def values(self) -> dict[str, str]: ...


# One HTTP request to the session's program through a tunnel, blocking: (method, target, body,
# extra headers) -> (status, headers, body). Raises OSError (or an SSH error) while it cannot
# be reached.
NodeRequest = Callable[[str, str, bytes, list[tuple[str, str]]], tuple[int, Headers, bytes]]

_environment = EnvReader()


@dataclass(frozen=True)
class NodeTool:
    """A program (or folder) a kind needs on compute nodes, and where it is found there: the
    environment variable ``setting`` on the platform's servers, else ``default`` (a command on
    the node's PATH, or a path). Its starter is told with ``--option LOCATION``."""

    option: str
    setting: str
    default: str
    what: str

    def location(self) -> str:
        return _environment.string(self.setting, self.default)


@dataclass(frozen=True)
class ProxyLogin:
    """What the proxy adds to each request and WebSocket it sends to the program."""

    cookies: dict[str, str] = field(default_factory=dict)
    headers: Headers = field(default_factory=list)


class SessionKind:
    """A kind of session. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    label: ClassVar[str]
    description: ClassVar[str]
    # How many characters of the fresh per-session password the program takes.
    secret_length: ClassVar[int] = 32
    tools: ClassVar[tuple[NodeTool, ...]] = ()
    # Whether the program serves its pages under /s/<id>/ itself (it is told its base path);
    # otherwise the proxy strips that prefix and puts it back on redirects and cookie paths.
    keeps_prefix: ClassVar[bool] = False
    # Where the browser lands, under /s/<id>/ ("": the program's own root).
    landing_path: ClassVar[str] = ""
    # WebSocket paths (under /s/<id>/) whose messages are a byte stream to one of the
    # program's sockets on the node (the route its starter asked for), not a WebSocket there.
    raw_routes: ClassVar[dict[str, str]] = {}
    # Seconds the program may take to answer through the tunnel once its launcher is ready.
    ready_within: ClassVar[float] = 30.0

    # What people fill in when they launch it (an operator's app's fields; none built in).
    fields: tuple[FieldSpec, ...] = ()

    def seen_by(self, user: AbstractBaseUser | AnonymousUser) -> bool:
        """Whether ``user`` may launch it at all (and sees it listed)."""
        return True

    def offered_on(self, cluster: str, environment: str | None) -> bool:
        """Whether it runs on this cluster and environment (None: a worker from none)."""
        return True

    def checked_values(self, values: Mapping[str, object]) -> dict[str, str]:
        """The values a launch gives its fields, checked, defaults filled in; raises
        ParameterError naming the field."""
        if values:
            raise ParameterError("values", f"{self.label} takes no values")
        return {}

    @cached_property
    def starter(self) -> str:
        """The node starter's source (node/starters/<name>.py)."""
        return starter_source(self.name)

    def starter_options(self, session: Session) -> dict[str, str]:
        """What its starter is told on the command line (never a secret: argv is public)."""
        return {tool.option: tool.location() for tool in self.tools}

    def log_in(self, request: NodeRequest, session: Session) -> str:
        """Check that the program answers through the tunnel (raise OSError while it does not)
        and log in as the browser would; returns the login the proxy keeps ("" for none)."""
        raise NotImplementedError

    def proxy_login(self, login: str) -> ProxyLogin:
        """What the proxy adds so that the owner never types the program's password."""
        return ProxyLogin()

    def page(self, session: Session) -> str | None:
        """A page the platform serves at the session's root instead of the program's."""
        return None
