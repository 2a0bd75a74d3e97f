"""Apps defined by operators (issue 37), without a cluster: the checks that refuse a bad app
(each by its field), YAML in and out, the registry listing apps beside the built-in kinds,
who sees an app, and the values a launch gives reaching the node's starter verbatim."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import AbstractUser, Group
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from node.starters import app as node_app_starter
from schedulers.host import HostAdapter
from sessions_app import kinds, launch
from sessions_app.catalog import rules, store, yaml_files
from sessions_app.catalog.models import App
from sessions_app.catalog.spec import AppSpec, FieldSpec, read_node_spec
from sessions_app.kinds.operator import OperatorApp
from sessions_app.models import Session
from tests.factories import WorkerFactory
from workers_app.models import ApiKey, Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db
TENSORBOARD = """\
---
name: tensorboard
label: TensorBoard
description: Training curves from a log folder.
icon: chart
command: [tensorboard, --logdir, '{logdir}', --path_prefix, '{base_path}', --port, '{port}']
env: {}
reach: tcp
keeps_prefix: true
ready: {path: '', statuses: [200], timeout: 90}
login: {kind: none}
landing_path: ''
fields:
- {name: logdir, label: Logs, default: ~/runs, pattern: '[^\\n]+', required: true, choices: []}
clusters: []
environments: []
groups: []
"""
NOTEBOOK = """\
---
name: notebook
label: Notebook
description: A notebook server that wants a token.
icon: book
command: [notebook-server, --socket, '{socket}', --base, '{base_url}', --mode, '{mode}']
env: {NB_TOKEN: '{secret}'}
reach: unix
keeps_prefix: true
ready: {path: api/ready, statuses: [200, 204], timeout: 60}
login: {kind: header, name: Authorization, value: 'token {secret}'}
landing_path: tree
fields:
- {name: mode, label: Mode, default: edit, pattern: '', required: false, choices: [edit, run]}
clusters: []
environments: []
groups: []
"""


@pytest.fixture(autouse=True)
def _no_app_remembered() -> None:
    """An app a rolled-back test saved is not remembered by the next (the registry's cache)."""
    store.forget_recent()


def test_a_change_to_an_app_is_seen_at_once_though_the_proxy_remembers_it() -> None:
    yaml_files.import_texts([("tb.yaml", TENSORBOARD)])
    assert kinds.get("tensorboard").label == "TensorBoard"
    app = App.objects.get(name="tensorboard")
    app.label = "Board"
    app.save()
    assert kinds.get("tensorboard").label == "Board"
    app.groups.add(Group.objects.create(name="team"))
    assert kinds.get("tensorboard").spec.groups == ("team",)  # type: ignore[attr-defined]


def spec(**changes: Any) -> dict[str, Any]:
    """A good app in the YAML file's shape, with ``changes``."""
    data: dict[str, Any] = yaml.safe_load(TENSORBOARD)
    data.update(changes)
    return data


def problems_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(rules.AppProblems) as refused:
        rules.read(data)
    return [f"{rules.spell(path)}: {message}" for path, message in refused.value.problems]


def field(**changes: Any) -> dict[str, Any]:
    return {"name": "logdir", "label": "Log folder", "default": "~/runs", **changes}


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        ({"name": "desktop"}, "name: 'desktop' is a built-in session type"),
        ({"name": "Tensor-Board"}, "name: must be 1 to 32 lower-case letters"),
        ({"label": ""}, "label: is required"),
        ({"command": []}, "command: must name the program to run"),
        ({"command": ["tb", "{port}", "{nope}"]}, "command[2]: {nope} is not a placeholder"),
        ({"command": ["tb", "{port}", "--token={secret}"]}, "command[2]: {secret} may not be"),
        ({"command": ["tb", "{port:5}"]}, "command[1]: is not a template"),
        ({"command": ["tb", "{port"]}, "command[1]: is not a template"),
        ({"command": ["tb", "--logdir", "{logdir}"]}, "command: must tell the program its {port}"),
        ({"command": ["tb", "{port}", "{socket}"]}, "command: {socket} is for reach unix"),
        ({"env": {"TOKEN": "{nope}"}}, "env.TOKEN: {nope} is not a placeholder"),
        ({"env": {"BAD NAME": "x"}}, "env.BAD NAME: is not an environment variable's name"),
        ({"reach": "udp"}, "reach: must be one of: unix, tcp"),
        ({"colour": "red"}, "colour: is not a key an app takes"),
        ({"fields": [field(pattern="([")]}, "fields[0].pattern: is not a regular expression"),
        ({"fields": [field(pattern=r"/\w+")]}, "fields[0].default: does not match the pattern"),
        ({"fields": [field(choices=["a", "b"])]}, "fields[0].default: is not one of the choices"),
        ({"fields": [field(name="port")]}, "fields[0].name: 'port' is a placeholder the node"),
        ({"fields": [field(), field()]}, "fields[1].name: 'logdir' is named twice"),
        ({"ready": {"statuses": [700]}}, "ready.statuses[0]: must be an HTTP status"),
        ({"ready": {"timeout": 0}}, "ready.timeout: must be 1 to 3600 seconds"),
        ({"ready": {"path": "/abs"}}, "ready.path: must be a path under the app's base URL"),
        ({"landing_path": "https://evil.example/"}, "landing_path: must be a path under"),
        ({"login": {"kind": "magic"}}, "login.kind: must be one of: none, header, cookie, form"),
        (
            {"login": {"kind": "header", "name": "X-Token", "value": "{port}"}},
            "login.value: may use {secret} and no other placeholder",
        ),
        ({"login": {"kind": "form", "path": "login"}}, "login.fields: must map the form's"),
        ({"environments": ["compute"]}, "environments[0]: must be cluster/environment"),
    ],
)
def test_a_bad_app_is_refused_naming_its_field(changes: dict[str, Any], refusal: str) -> None:
    found = problems_of(spec(**changes))
    assert any(problem.startswith(refusal) for problem in found), found


def test_secret_is_taken_in_the_environment_and_the_login_but_not_the_command() -> None:
    app = rules.read(yaml.safe_load(NOTEBOOK))
    assert app.env == {"NB_TOKEN": "{secret}"} and app.login["value"] == "token {secret}"


def test_an_import_then_an_export_gives_the_same_text_back() -> None:
    text = TENSORBOARD
    assert yaml_files.import_texts([("tensorboard.yaml", text), ("notebook.yaml", NOTEBOOK)]) == [
        ("tensorboard", True),
        ("notebook", True),
    ]
    assert yaml_files.dump(store.all_specs(["tensorboard"])) == text
    assert yaml_files.dump(store.all_specs(["notebook"])) == NOTEBOOK
    # Read back and written again: the same text (a site keeps its catalogue in git).
    both = yaml_files.dump(store.all_specs())
    yaml_files.import_texts([("all.yaml", both)])
    assert yaml_files.dump(store.all_specs()) == both


def test_the_management_commands_import_and_export(tmp_path: Path, capsys: Any) -> None:
    notebook = tmp_path / "notebook.yaml"
    notebook.write_text(NOTEBOOK)
    tensorboard = tmp_path / "tensorboard.yaml"
    tensorboard.write_text(TENSORBOARD)
    call_command("import_apps", str(tensorboard), str(notebook))
    assert capsys.readouterr().out.split("\n")[:2] == ["created tensorboard", "created notebook"]
    call_command("import_apps", str(notebook))
    assert capsys.readouterr().out.strip() == "updated notebook"
    call_command("export_apps", "tensorboard")
    assert capsys.readouterr().out == TENSORBOARD
    with pytest.raises(CommandError, match="no app named nope"):
        call_command("export_apps", "nope")


def test_a_bad_file_changes_nothing_and_says_where(tmp_path: Path) -> None:
    yaml_files.import_texts([("tensorboard.yaml", TENSORBOARD)])
    before = yaml_files.dump(store.all_specs())
    renamed = tmp_path / "tensorboard.yaml"
    renamed.write_text(TENSORBOARD.replace("label: TensorBoard", "label: Renamed"))
    bad = tmp_path / "notebook.yaml"
    bad.write_text(NOTEBOOK.replace("pattern: ''", "pattern: '(['"))
    with pytest.raises(yaml_files.CatalogFileError) as refused:
        yaml_files.import_files([renamed, bad])
    assert str(refused.value).startswith(f"{bad}:14: fields[0].pattern: is not a regular")
    # Broken YAML, and a cluster this platform lacks (found only once saving began).
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ncommand: [a, b\n")
    with pytest.raises(yaml_files.CatalogFileError, match=rf"^{broken}:3: not YAML"):
        yaml_files.import_files([renamed, broken])
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(NOTEBOOK.replace("clusters: []", "clusters: [mars]"))
    with pytest.raises(yaml_files.CatalogFileError) as refused:
        yaml_files.import_files([renamed, elsewhere])
    assert str(refused.value) == f"{elsewhere}:15: clusters[0]: no cluster named 'mars' here"
    assert yaml_files.dump(store.all_specs()) == before
    assert not App.objects.filter(name="notebook").exists()


def test_the_registry_lists_enabled_apps_after_the_built_in_kinds() -> None:
    built_in = kinds.names()
    assert built_in == ["desktop", "jupyter", "vscode"]
    yaml_files.import_texts([("a.yaml", TENSORBOARD), ("b.yaml", NOTEBOOK)])
    assert kinds.names() == [*built_in, "notebook", "tensorboard"]
    assert ("tensorboard", "TensorBoard") in kinds.choices()
    tensorboard = kinds.get("tensorboard")
    assert isinstance(tensorboard, OperatorApp) and tensorboard.keeps_prefix
    assert (
        tensorboard.starter
        == (Path(launch.__file__).parents[1] / "node/starters/app.py").read_text()
    )
    App.objects.filter(name="tensorboard").update(enabled=False)
    assert "tensorboard" not in kinds.names()
    # A session of an app disabled since keeps running: the registry still finds it by name.
    assert kinds.get("tensorboard").label == "TensorBoard"
    with pytest.raises(kinds.UnknownKind):
        kinds.get("emacs")


def api(user: AbstractUser) -> APIClient:
    client = APIClient()
    _, key = ApiKey.issue(user)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def connected_worker(owner: AbstractUser) -> Worker:
    worker: Worker = WorkerFactory(
        owner=owner, status=WorkerStatus.CONNECTED, scheduler_job_id="41", node_hostname="n1"
    )
    return worker


def launch_body(worker: Worker, **extra: Any) -> dict[str, Any]:
    return {
        "type": "tensorboard",
        "cluster": worker.cluster.name,
        "worker": worker.public_id,
        **extra,
    }


def test_an_app_limited_to_a_group_is_invisible_to_others_and_refused_by_name(
    user: AbstractUser, other_user: AbstractUser, client: Any
) -> None:
    yaml_files.import_texts([("tb.yaml", TENSORBOARD)])
    team = Group.objects.create(name="ml-team")
    store.save(AppSpec(**{**store.all_specs()[0].__dict__, "groups": ("ml-team",)}))
    user.groups.add(team)
    mine, theirs = connected_worker(user), connected_worker(other_user)

    client.force_login(other_user)
    page = client.get("/sessions/").content.decode()
    assert "TensorBoard" not in page and "value:tensorboard:logdir" not in page
    listed = [kind["name"] for kind in api(other_user).get("/api/sessions/kinds/").json()]
    assert listed == ["desktop", "jupyter", "vscode"]
    refused = api(other_user).post("/api/sessions/", launch_body(theirs), format="json")
    assert refused.status_code == 400 and refused.json()["field"] == "type", refused.json()
    assert "tensorboard" not in refused.json()["detail"]
    assert not Session.objects.exists()

    client.force_login(user)
    page = client.get("/sessions/").content.decode()
    assert 'value="tensorboard"' in page and 'name="value:tensorboard:logdir"' in page
    [tensorboard] = [
        k for k in api(user).get("/api/sessions/kinds/").json() if k["name"] == "tensorboard"
    ]
    assert tensorboard["fields"][0]["name"] == "logdir" and tensorboard["fields"][0]["required"]
    made = api(user).post("/api/sessions/", launch_body(mine), format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["type"] == "tensorboard" and made.json()["values"] == {"logdir": "~/runs"}
    details = client.get(f"/sessions/{made.json()['id']}/").content.decode()
    assert "<dt>logdir</dt><dd><code>~/runs</code></dd>" in details


def test_an_app_limited_to_a_cluster_is_not_offered_elsewhere(user: AbstractUser) -> None:
    worker = connected_worker(user)
    elsewhere = WorkerFactory(owner=user, status=WorkerStatus.CONNECTED, scheduler_job_id="42")
    yaml_files.import_texts([("tb.yaml", TENSORBOARD)])
    base = store.all_specs()[0]
    store.save(AppSpec(**{**base.__dict__, "clusters": (worker.cluster.name,)}))
    answer = api(user).post("/api/sessions/", launch_body(elsewhere), format="json")
    assert answer.status_code == 400 and "not offered" in answer.json()["detail"]
    assert api(user).post("/api/sessions/", launch_body(worker), format="json").status_code == 201


def test_values_are_checked_against_their_fields(user: AbstractUser) -> None:
    yaml_files.import_texts([("nb.yaml", NOTEBOOK), ("tb.yaml", TENSORBOARD)])
    worker = connected_worker(user)
    for values, where, words in (
        ({"mode": "delete"}, "values.mode", "must be one of: edit, run"),
        ({"colour": "red"}, "values.colour", "unknown field"),
        ({"mode": "edit\x00"}, "values.mode", "at most"),
    ):
        body = launch_body(worker, type="notebook", values=values)
        answer = api(user).post("/api/sessions/", body, format="json")
        assert answer.status_code == 400 and answer.json()["field"] == where, answer.json()
        assert words in answer.json()["detail"]
    multiline = launch_body(worker, values={"logdir": "a\nb"})
    assert api(user).post("/api/sessions/", multiline, format="json").json()["field"] == (
        "values.logdir"
    )
    built_in = launch_body(worker, type="desktop", values={"x": "1"})
    assert api(user).post("/api/sessions/", built_in, format="json").json()["field"] == "values"


SHELL_BAIT = (
    "$(touch /tmp/pwned-APP) `touch /tmp/pwned-APP`; touch /tmp/pwned-APP | & && "
    "' \" \\ * ~ {port} %s"
)


def test_values_with_shell_metacharacters_reach_the_starter_verbatim_and_run_nothing(
    user: AbstractUser, tmp_path: Path
) -> None:
    yaml_files.import_texts([("tb.yaml", TENSORBOARD)])
    bait = SHELL_BAIT.replace("/tmp/pwned-APP", str(tmp_path / "pwned"))
    worker = connected_worker(user)
    made = api(user).post(
        "/api/sessions/", launch_body(worker, values={"logdir": bait}), format="json"
    )
    assert made.status_code == 201, made.json()
    session = Session.objects.get(public_id=made.json()["id"])
    assert session.values == {"logdir": bait}

    argv = launch._launcher_argv(session)
    token = argv[argv.index("--spec-b64") + 1]
    # Nothing a shell reads: the token is base64's URL-safe alphabet.
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=")
    told = read_node_spec(token)
    assert told["values"] == {"logdir": bait} and told["base_url"] == session.url_path
    assert told["command"][2] == "{logdir}" and told["reach"] == "tcp"

    # The login host's shell runs the step's command line (as launch.launch builds it): the
    # program it starts gets the token unchanged, and nothing of the value ran.
    echo = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
    adapter = HostAdapter(None)  # type: ignore[arg-type] - builds a command line, runs nothing
    step = adapter.interactive_command("h1", [*echo, *argv[3:]], pty=False)
    ran = subprocess.run(["sh", "-c", step], capture_output=True, text=True, check=True, timeout=30)
    received = json.loads(ran.stdout)
    assert received[received.index("--spec-b64") + 1] == token
    assert not (tmp_path / "pwned").exists()
    # The node's starter reads the same values back, and fills the command with them as they are.
    starter_spec = node_app_starter.read_spec(token)
    assert starter_spec["values"] == {"logdir": bait}
    known = {"port": "20001", "base_path": "/s/x", "logdir": bait}
    argv_on_node, _ = node_app_starter.program_argv_and_env(starter_spec, known, "pw")
    assert argv_on_node[2] == bait
    assert shlex.split(shlex.join(argv_on_node))[2] == bait


class FakeNode:
    """What answers through the tunnel: records the requests, answers as told."""

    def __init__(self, answers: dict[tuple[str, str], tuple[int, list[tuple[bytes, bytes]]]]):
        self.answers = answers
        self.asked: list[tuple[str, str, bytes, list[tuple[str, str]]]] = []

    def __call__(
        self, method: str, target: str, body: bytes, extra: list[tuple[str, str]]
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        self.asked.append((method, target, body, extra))
        status, headers = self.answers.get((method, target), (404, []))
        return status, headers, b""


class FakeSession:
    url_path = "/s/sabc/"
    name = "nb"
    values: dict[str, str] = {}

    def secret(self) -> str:
        return "pa55"


def test_a_header_login_is_checked_at_the_ready_path_and_sent_by_the_proxy() -> None:
    kind = OperatorApp(rules.read(yaml.safe_load(NOTEBOOK)))
    node = FakeNode({("GET", "/s/sabc/api/ready"): (204, [])})
    login = kind.log_in(node, FakeSession())
    assert node.asked == [("GET", "/s/sabc/api/ready", b"", [("Authorization", "token pa55")])]
    assert kind.proxy_login(login).headers == [(b"Authorization", b"token pa55")]
    with pytest.raises(OSError, match="answered 404, not 200, 204"):
        kind.log_in(FakeNode({}), FakeSession())


def test_a_form_login_is_posted_once_and_its_cookies_kept() -> None:
    data = yaml.safe_load(NOTEBOOK)
    data["keeps_prefix"] = False
    data["login"] = {"kind": "form", "path": "login", "fields": {"password": "{secret}"}}
    kind = OperatorApp(rules.read(data))
    node = FakeNode(
        {
            ("POST", "/login"): (302, [(b"Set-Cookie", b"sid=abc; Path=/; HttpOnly")]),
            ("GET", "/api/ready"): (200, []),
        }
    )
    login = kind.log_in(node, FakeSession())
    assert node.asked[0][:3] == ("POST", "/login", b"password=pa55")
    assert node.asked[1][3] == [("Cookie", "sid=abc")]
    assert kind.proxy_login(login).cookies == {"sid": "abc"}


def test_the_built_in_kinds_stay_as_they_were() -> None:
    assert [k.name for k in kinds.builtin().values()] == ["desktop", "jupyter", "vscode"]
    assert all(not k.fields for k in kinds.builtin().values())
    assert FieldSpec(name="x").required is False


@pytest.mark.parametrize(
    "path", sorted((Path(launch.__file__).parents[1] / "docs/apps").glob("*.yaml"))
)
def test_the_documented_apps_import_and_export_to_the_same_apps(path: Path) -> None:
    text = path.read_text()
    [name] = [app.spec.name for app in yaml_files.read_text(text, path.name)]
    yaml_files.import_files([path])
    exported = yaml_files.dump(store.all_specs([name]))
    assert rules.read(yaml.safe_load(exported)) == rules.read(yaml.safe_load(text))
    yaml_files.import_texts([("again.yaml", exported)])
    assert yaml_files.dump(store.all_specs([name])) == exported


def admin_form(**changes: str) -> dict[str, str]:
    form = {
        "name": "tensorboard",
        "label": "TensorBoard",
        "description": "",
        "icon": "chart",
        "command": json.dumps(["tensorboard", "--logdir", "{logdir}", "--port", "{port}"]),
        "env": "{}",
        "reach": "tcp",
        "keeps_prefix": "on",
        "ready_path": "",
        "ready_statuses": "[200]",
        "start_timeout": "90",
        "login": json.dumps({"kind": "none"}),
        "landing_path": "",
        "enabled": "on",
        "fields-TOTAL_FORMS": "1",
        "fields-INITIAL_FORMS": "0",
        "fields-MIN_NUM_FORMS": "0",
        "fields-MAX_NUM_FORMS": "1000",
        "fields-0-position": "0",
        "fields-0-name": "logdir",
        "fields-0-label": "Log folder",
        "fields-0-default": "~/runs",
        "fields-0-pattern": "",
        "fields-0-choices": "[]",
    }
    form.update(changes)
    return form


def test_the_admin_adds_an_app_refuses_a_bad_one_and_imports_and_exports_yaml(
    admin_client: Any,
) -> None:
    bad = admin_client.post(
        "/admin/sessions_app/app/add/",
        admin_form(**{"fields-0-pattern": "([", "command": '["tb", "{secret}", "{port}"]'}),
    )
    assert bad.status_code == 200
    page = bad.content.decode()
    assert "fields[0].pattern: is not a regular expression" in page
    assert "command[1]: {secret} may not be in the command line" in page
    assert not App.objects.exists()

    added = admin_client.post("/admin/sessions_app/app/add/", admin_form())
    assert added.status_code == 302, added.content.decode()[:3000]
    assert kinds.get("tensorboard").fields[0].name == "logdir"

    exported = admin_client.post(
        "/admin/sessions_app/app/",
        {"action": "export_yaml", "_selected_action": [App.objects.get().pk]},
    )
    assert exported["Content-Type"].startswith("application/yaml")
    text = exported.content.decode()
    assert yaml.safe_load(text)["command"][2] == "{logdir}"

    upload = SimpleUploadedFile("notebook.yaml", NOTEBOOK.encode())
    imported = admin_client.post("/admin/sessions_app/app/import/", {"uploads": [upload]})
    assert imported.status_code == 302
    broken = SimpleUploadedFile(
        "broken.yaml", NOTEBOOK.replace("reach: unix", "reach: udp").encode()
    )
    refused = admin_client.post("/admin/sessions_app/app/import/", {"uploads": [broken]})
    assert "Nothing was imported." in refused.content.decode()
    assert "broken.yaml:8: reach: must be one of: unix, tcp" in refused.content.decode()
    assert sorted(App.objects.values_list("name", "reach")) == [
        ("notebook", "unix"),
        ("tensorboard", "tcp"),
    ]


def test_a_failed_starts_long_error_keeps_its_last_lines() -> None:
    # The app starter ends its error with the program's last lines; the reason has 512 room.
    error = "tensorboard exited with status 1; its last lines:\n" + "\n".join(
        f"line {n}: " + "x" * 40 for n in range(40)
    )
    kept = launch._shortened(error)
    assert len(kept) <= 480 and kept.startswith("tensorboard exited with status 1")
    assert kept.endswith("line 39: " + "x" * 40)


def test_an_app_with_a_live_session_is_not_deleted_in_the_admin(
    admin_client: Any, user: AbstractUser
) -> None:
    yaml_files.import_texts([("tb.yaml", TENSORBOARD)])
    app = App.objects.get()
    made = api(user).post("/api/sessions/", launch_body(connected_worker(user)), format="json")
    assert made.status_code == 201
    assert (
        admin_client.post(f"/admin/sessions_app/app/{app.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    listed = admin_client.post(
        "/admin/sessions_app/app/",
        {"action": "delete_selected", "_selected_action": [app.pk], "post": "yes"},
    )
    assert listed.status_code in (200, 302, 403) and App.objects.exists()
    Session.objects.update(status="ended")
    admin_client.post(f"/admin/sessions_app/app/{app.pk}/delete/", {"post": "yes"})
    assert not App.objects.exists()
