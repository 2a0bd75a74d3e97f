"""Forms of the browser UI. The actions validate; these forms only collect and place errors."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django import forms

from core.errors import ParameterError
from workers_app import idle
from workers_app.actions.requests import BULK_MAX
from workers_app.models import Cluster, Environment, EnvironmentField, FieldKind, Reachability

NAME_MAX = 128
PARAM_PREFIX = "param_"


@dataclass(frozen=True)
class EnvironmentOption:
    """One environment in the request dialog, and why it cannot be chosen if it cannot."""

    environment: Environment
    unavailable: str

    @property
    def selectable(self) -> bool:
        return not self.unavailable

    @property
    def nodes(self) -> str:
        env = self.environment
        if env.nodes_available is None:
            return "node count not known yet"
        if env.nodes_total is None:
            return f"{env.nodes_available} nodes available"
        return f"{env.nodes_available} of {env.nodes_total} nodes available"


@dataclass(frozen=True)
class ClusterGroup:
    cluster: Cluster
    options: list[EnvironmentOption]
    needs_account: bool
    # A certificate cluster the user's name maps to no Unix name on.
    unmapped: bool = False


def environment_groups(
    clusters: Iterable[Cluster],
    *,
    connected_cluster_ids: set[int],
    unmapped_cluster_ids: frozenset[int] = frozenset(),
) -> list[ClusterGroup]:
    """Environments grouped by cluster (clusters with prefetched environments and fields)."""
    groups = []
    for cluster in clusters:
        offline = cluster.reachability == Reachability.OFFLINE
        unmapped = cluster.pk in unmapped_cluster_ids
        options = [
            EnvironmentOption(
                environment=env,
                unavailable=(
                    "inactive"
                    if not env.is_active
                    else "cluster offline"
                    if offline
                    else "no Unix name for you here"
                    if unmapped
                    else ""
                ),
            )
            for env in cluster.environments.all()
        ]
        needs_account = (
            not cluster.shared and not unmapped and cluster.pk not in connected_cluster_ids
        )
        groups.append(
            ClusterGroup(
                cluster=cluster, options=options, needs_account=needs_account, unmapped=unmapped
            )
        )
    return groups


def _param_field(spec: EnvironmentField) -> forms.Field:
    label = spec.label or spec.name
    if spec.required and not spec.default:
        label += " (required)"
    attrs: dict[str, str] = {}
    if spec.example:
        attrs["placeholder"] = spec.example
    field: forms.Field
    if spec.choices:
        choices = [(str(choice), str(choice)) for choice in spec.choices]
        if not spec.default:
            choices.insert(0, ("", "(none)"))
        field = forms.ChoiceField(label=label, choices=choices, required=False)
    elif spec.kind == FieldKind.DIRECTIVES:
        attrs["rows"] = "3"
        field = forms.CharField(
            label=label, required=False, strip=False, widget=forms.Textarea(attrs=attrs)
        )
    else:
        attrs["autocomplete"] = "off"
        field = forms.CharField(label=label, required=False, widget=forms.TextInput(attrs=attrs))
    field.initial = spec.default
    hints = []
    if spec.example:
        hints.append(f"Example: {spec.example}")
    if spec.default:
        hints.append(f"Default: {spec.default}")
    field.help_text = ". ".join(hints)
    return field


class RequestWorkerForm(forms.Form):
    """Environment, optional name, and the environment's scheduling fields."""

    environment = forms.ChoiceField(
        error_messages={
            "required": "Choose an environment.",
            "invalid_choice": "Choose an active environment on a cluster that is not offline.",
        }
    )
    name = forms.CharField(
        required=False,
        max_length=NAME_MAX,
        help_text="Optional; shown in lists. Left empty, the environment's name and an id.",
        widget=forms.TextInput(attrs={"autocomplete": "off"}),
    )
    count = forms.IntegerField(
        label="How many",
        min_value=1,
        max_value=BULK_MAX,
        initial=1,
        required=False,
        help_text="Workers alike, requested together; with a name they are NAME-1, NAME-2, ...",
        widget=forms.NumberInput(attrs={"min": 1, "max": BULK_MAX, "inputmode": "numeric"}),
    )

    idle_minutes = forms.FloatField(
        label="Delete when idle for (minutes)",
        required=False,
        min_value=0,
        help_text="Nothing running and nobody using it for this long: you are warned, then the "
        "worker is deleted. Empty: never.",
        widget=forms.NumberInput(attrs={"min": 0, "step": "any", "inputmode": "decimal"}),
    )
    save_as = forms.CharField(
        label="Save these settings as",
        required=False,
        max_length=64,
        help_text="Optional; a name to request the same again from this dialog or with "
        "pw workers create --from NAME. Saving a name again replaces it.",
        widget=forms.TextInput(attrs={"autocomplete": "off"}),
    )

    def __init__(
        self, *args: Any, groups: list[ClusterGroup], selected: Environment | None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.groups = groups
        self.selectable = {
            str(option.environment.pk): option.environment
            for group in groups
            for option in group.options
            if option.selectable
        }
        env_field = self.fields["environment"]
        assert isinstance(env_field, forms.ChoiceField)
        env_field.choices = [(pk, str(env)) for pk, env in self.selectable.items()]
        self.selected = selected
        self.specs: list[EnvironmentField] = list(selected.fields.all()) if selected else []
        for spec in self.specs:
            self.fields[PARAM_PREFIX + spec.name] = _param_field(spec)
        if selected is not None:
            self.fields["idle_minutes"].initial = idle.site_default(selected)

    def prefill(self, params: dict[str, str]) -> None:
        """Start from these field values (a saved request's) instead of the defaults."""
        for name, value in params.items():
            field = self.fields.get(PARAM_PREFIX + name)
            if field is not None:
                field.initial = value

    @property
    def selected_pk(self) -> str:
        return str(self.selected.pk) if self.selected else ""

    def _bound(self, specs: Iterable[EnvironmentField]) -> list[forms.BoundField]:
        return [self[PARAM_PREFIX + spec.name] for spec in specs]

    @property
    def main_fields(self) -> list[forms.BoundField]:
        """Required fields without a default: the user must fill them, so they are not hidden."""
        return self._bound(s for s in self.specs if s.required and not s.default)

    @property
    def advanced_fields(self) -> list[forms.BoundField]:
        return self._bound(s for s in self.specs if not (s.required and not s.default))

    @property
    def advanced_open(self) -> bool:
        """Collapsed unless something in it is wrong or was changed from its default (a saved
        request's values included)."""
        changed = self.is_bound and any(
            field.data is not None and field.data != (field.initial or "")
            for field in self.advanced_fields
        )
        errors = any(field.errors for field in self.advanced_fields)
        prefilled = any(
            (self.fields[PARAM_PREFIX + s.name].initial or "") != s.default
            for s in self.specs
            if not (s.required and not s.default)
        )
        return changed or errors or prefilled

    def params(self) -> dict[str, str]:
        return {
            spec.name: self.cleaned_data.get(PARAM_PREFIX + spec.name) or "" for spec in self.specs
        }

    def add_parameter_error(self, exc: ParameterError) -> None:
        """Put the service's refusal next to the field it names (cluster and environment on top)."""
        key = PARAM_PREFIX + exc.field
        if exc.field in ("name", "save_as", "idle_minutes"):
            self.add_error(exc.field, exc.message)
        elif key in self.fields:
            spec = next(s for s in self.specs if s.name == exc.field)
            self.add_error(key, field_error_in_words(spec, exc.message))
        else:
            self.add_error(None, exc.message)


def field_error_in_words(spec: EnvironmentField, message: str) -> str:
    """``Account is required; example: proj-42``: the label leads, whoever wrote the message."""
    label = spec.label or spec.name
    if message.startswith(label):
        return message
    sentence = (
        f"{label} {message}" if message.startswith(("is ", "must ")) else f"{label}: {message}"
    )
    if spec.example and "example" not in message:
        sentence += f"; example: {spec.example}"
    return sentence


class ConnectAccountForm(forms.Form):
    remote_username = forms.CharField(
        label="Your user name on the cluster",
        max_length=64,
        widget=forms.TextInput(attrs={"autocomplete": "off", "placeholder": "alice"}),
    )
    private_key = forms.CharField(
        label="Private key (optional)",
        required=False,
        strip=False,
        widget=forms.Textarea(
            attrs={
                "rows": 4,
                "autocomplete": "off",
                "spellcheck": "false",
                "placeholder": "-----BEGIN OPENSSH PRIVATE KEY-----",
            }
        ),
        help_text="Leave empty and ACTIVATE generates a key pair: you then add its public key "
        "to ~/.ssh/authorized_keys on the cluster. A key you paste is stored encrypted and "
        "never shown again.",
    )

    def add_parameter_error(self, exc: ParameterError) -> None:
        self.add_error(exc.field if exc.field in self.fields else None, exc.message)


class ApiKeyForm(forms.Form):
    name = forms.CharField(
        max_length=128,
        required=False,
        help_text="What the key is for, e.g. laptop or CI.",
        widget=forms.TextInput(attrs={"autocomplete": "off", "placeholder": "laptop"}),
    )
