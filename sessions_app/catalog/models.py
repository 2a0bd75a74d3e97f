"""The catalogue's rows: an operator's app and the fields people fill when they launch it."""

from __future__ import annotations

from django.db import models


class Reach(models.TextChoices):
    # HTTP on a Unix socket in the session's private folder (told as {socket}).
    UNIX = "unix", "HTTP on its Unix socket"
    # HTTP on a loopback port (told as {port}) in a network namespace of the session's own,
    # bridged to the launcher's gate by the starter.
    TCP = "tcp", "HTTP on a port it is told"


class LoginKind(models.TextChoices):
    NONE = "none", "nothing"
    HEADER = "header", "a header"
    COOKIE = "cookie", "a cookie"
    FORM = "form", "a login form posted once"


def default_statuses() -> list[int]:
    return [200]


def no_login() -> dict[str, object]:
    return {"kind": LoginKind.NONE.value}


class App(models.Model):
    """A session kind an operator defines: what the node runs and how the proxy reaches it.
    Checked by ``sessions_app.catalog.rules`` wherever it is saved (the admin, the importer)."""

    name = models.CharField(
        max_length=32,
        unique=True,
        help_text="What `type` takes: lower-case letters, digits and underscores.",
    )
    label = models.CharField(max_length=128)
    description = models.TextField(blank=True)
    icon = models.CharField(max_length=32, blank=True)
    command = models.JSONField(
        default=list,
        help_text='The program and its arguments, a JSON list of templates, e.g. ["tensorboard", '
        '"--port", "{port}"]. Placeholders: {socket} {port} {base_url} {base_path} {home} {cwd} '
        "{workdir} {secret_file} and the fields' names; never {secret} (a command line is "
        "public).",
    )
    env = models.JSONField(
        default=dict,
        blank=True,
        help_text="Environment variables, name to template; these may use {secret}.",
    )
    reach = models.CharField(max_length=8, choices=Reach.choices, default=Reach.UNIX)
    keeps_prefix = models.BooleanField(
        default=False,
        help_text="It serves its pages under /s/<id>/ itself (else the proxy strips the prefix).",
    )
    ready_path = models.CharField(
        max_length=512, blank=True, help_text="Asked until it answers, under its base URL."
    )
    ready_statuses = models.JSONField(default=default_statuses)
    start_timeout = models.PositiveIntegerField(
        default=90, help_text="Seconds it may take to answer before the session fails."
    )
    login = models.JSONField(
        default=no_login,
        help_text='How the proxy logs the owner in: {"kind": "none"}, {"kind": "header", "name": '
        '..., "value": ...}, {"kind": "cookie", ...} or {"kind": "form", "path": ..., "fields": '
        "{...}}; values may use {secret}.",
    )
    landing_path = models.CharField(max_length=512, blank=True)
    enabled = models.BooleanField(default=True)
    clusters = models.ManyToManyField(
        "workers_app.Cluster",
        blank=True,
        related_name="+",
        help_text="Offered on these clusters only (none: on all).",
    )
    environments = models.ManyToManyField(
        "workers_app.Environment",
        blank=True,
        related_name="+",
        help_text="Offered on these environments only (none: on all).",
    )
    groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="+",
        help_text="Seen by members of these groups only (none: everyone).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AppField(models.Model):
    """A value people give when they launch the app, named as a placeholder in its command."""

    app = models.ForeignKey(App, on_delete=models.CASCADE, related_name="fields")
    name = models.CharField(max_length=64)
    label = models.CharField(max_length=128, blank=True)
    default = models.CharField(max_length=4096, blank=True)
    pattern = models.CharField(
        max_length=512, blank=True, help_text="Regular expression the whole value must match."
    )
    required = models.BooleanField(default=False)
    choices = models.JSONField(default=list, blank=True, help_text="Allowed values, if any.")
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["app", "name"], name="app_field_unique_per_app")
        ]

    def __str__(self) -> str:
        return self.name
