"""Issue 36's acceptance as people live it, on the live platform: a person who exists only at the
site's OpenID provider, and one who exists only in its directory, each sign in through their own
page in Chromium, land on Workers, request a worker on a cluster that trusts the platform's
certificates without connecting any key, and `pw ssh` on it says their mapped Unix name;
logging out, then opening the platform, asks them to log in again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from harness import REPO
from harness.cells import Cell
from harness.identity import (
    CAROL,
    DAVE,
    Provider,
    cli_client,
    directory_settings,
    running_provider,
    trusted_user_ca,
    web_client,
)
from harness.platform import Platform, free_port
from harness.waiting import wait_for
from tests.browser import launched_chromium
from tests.e2e.conftest import compute_environment, pw_runner
from tests.platforms import sharing
from workers_app.actions.clusters import make_cluster_authority
from workers_app.models import AccountOrigin, ClusterAccount, Environment, Worker
from workers_app.statuses import WorkerStatus

pytestmark = [pytest.mark.slurm, pytest.mark.live]

SCREENSHOTS = REPO / "data" / "screenshots" / "sign-in"


@pytest.fixture(scope="module")
def site(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Platform, Provider]]:
    """The platform configured for the test provider and the test directory, as an operator
    would with ACTIVATE_OIDC_* and ACTIVATE_LDAP_* variables."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    clients = [web_client(f"{url}/oidc/callback/", post_logout_redirect_uri=f"{url}/login/")]
    with running_provider(clients=[*clients, cli_client()]) as provider:
        directory = directory_settings()
        knobs = {
            "ACTIVATE_OIDC_ISSUER": provider.issuer,
            "ACTIVATE_OIDC_CLIENT_ID": provider.web.client_id,
            "ACTIVATE_OIDC_CLIENT_SECRET": str(provider.web.client_secret),
            "ACTIVATE_OIDC_CLI_CLIENT_ID": provider.cli.client_id,
            "ACTIVATE_OIDC_LABEL": "Test IdP",
            "ACTIVATE_LDAP_URL": directory.url,
            "ACTIVATE_LDAP_USER_BASE": directory.people_dn,
            "ACTIVATE_LDAP_GROUP_BASE": directory.groups_dn,
            "ACTIVATE_LDAP_BIND_DN": directory.bind_dn,
            "ACTIVATE_LDAP_BIND_PASSWORD": directory.bind_password,
        }
        workdir = tmp_path_factory.mktemp("platform")
        with sharing(Platform(workdir=workdir, port=port, knobs=knobs)) as running:
            yield running, provider


@pytest.fixture
def platform(transactional_db: None, site: tuple[Platform, Provider]) -> Platform:
    return site[0]


@pytest.fixture
def certificate_environment(make_cluster: Any, cell: Cell) -> Iterator[Environment]:
    """A per-user Slurm cluster whose login host trusts the platform's CA for it, naming
    people in lower case (the provider calls carol "PWCarol")."""
    cluster = make_cluster(name="certs", shared=False, unix_name_rule="lower")
    line = make_cluster_authority(cluster)
    with trusted_user_ca(line):
        yield compute_environment(cluster, cell)


@pytest.fixture
def chromium() -> Iterator[Any]:
    with launched_chromium() as browser:
        yield browser


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def request_in_the_dialog(page: Any, base: str, environment: Environment, name: str) -> Worker:
    page.click("a.button:has-text('Create')")
    dialog = page.locator("dialog#dialog")
    dialog.wait_for(state="visible")
    option = dialog.locator(f"input[name=environment][value='{environment.pk}']")
    assert option.is_enabled(), dialog.inner_text()
    option.check()
    dialog.locator("#id_name").fill(name)
    dialog.locator("button:has-text('Request worker')").click()
    page.get_by_text(f"Worker {name} requested.").wait_for()
    return Worker.objects.get(name=name)


def connected(worker: Worker, platform: Platform) -> Worker:
    def is_connected() -> bool:
        worker.refresh_from_db()
        assert worker.status not in {WorkerStatus.ERROR, WorkerStatus.STOPPED}, (
            f"{worker.status}: {worker.status_reason}\n{platform.logs()[-4000:]}"
        )
        return worker.status == WorkerStatus.CONNECTED

    wait_for(is_connected, timeout=120)
    return worker


def logs_out_and_is_asked_to_log_in_again(page: Any, base: str, *, at_provider: bool) -> None:
    page.get_by_role("button", name="Log out").click()
    if at_provider:
        page.get_by_role("button", name="Yes, sign me out").click()
    page.wait_for_url(f"{base}/login/**")
    page.goto(base + "/")
    assert page.url.startswith(f"{base}/login/"), page.url
    assert page.locator("#id_password").is_visible()


def unix_name_by_pw_ssh(platform: Platform, user: User, worker: Worker, home: Path) -> str:
    pw = pw_runner(platform, user, home)
    listed = pw("cluster", "ls", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    [certs] = [c for c in json.loads(listed.stdout) if c["name"] == "certs"]
    assert certs["login"] == "certificate", certs
    whoami = pw("ssh", worker.public_id, "id", "-un")
    assert whoami.returncode == 0, whoami.stderr
    assert whoami.stdout.strip() == certs["unix_name"], (whoami.stdout, certs)
    return whoami.stdout.strip()


def test_a_person_of_the_provider_signs_in_requests_a_worker_and_is_their_unix_name(
    platform: Platform,
    certificate_environment: Environment,
    chromium: Any,
    tmp_path: Path,
) -> None:
    base = platform.url
    page = chromium.new_context(viewport={"width": 1280, "height": 860}).new_page()
    # Given carol, who exists only at the provider: the platform sends her to its login page
    page.goto(base + "/")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    page.get_by_label("Login").fill(CAROL.login)
    page.get_by_label("Password").fill(CAROL.password)
    shot(page, "01-provider-login")
    page.get_by_role("button", name="Sign in").click()
    # Then she lands on Workers, signed in
    page.wait_for_url(base + "/workers/")
    shot(page, "02-workers-after-sso")
    carol = User.objects.get(identity__subject=CAROL.sub)
    # When she requests a worker on the certificate cluster, having connected no key
    assert not ClusterAccount.objects.filter(user=carol).exists()
    worker = connected(request_in_the_dialog(page, base, certificate_environment, "sso"), platform)
    page.locator("tr", has_text=worker.public_id).get_by_text("connected").wait_for()
    shot(page, "03-worker-connected")
    # Then its job runs as her mapped Unix name, which pw ssh shows
    account = ClusterAccount.objects.get(user=carol)
    assert (account.remote_username, account.origin) == ("pwcarol", AccountOrigin.CERTIFICATE)
    assert not account.private_key_encrypted
    assert unix_name_by_pw_ssh(platform, carol, worker, tmp_path) == "pwcarol"
    # And logging out ends her session at the provider too; the platform asks for a login again
    logs_out_and_is_asked_to_log_in_again(page, base, at_provider=True)
    shot(page, "04-logged-out")


def test_a_person_of_the_directory_signs_in_with_the_password_form_and_is_their_unix_name(
    platform: Platform,
    certificate_environment: Environment,
    chromium: Any,
    tmp_path: Path,
) -> None:
    base = platform.url
    page = chromium.new_context(viewport={"width": 1280, "height": 860}).new_page()
    # Given dave, who exists only in the directory, at the password form
    page.goto(base + "/")
    page.fill("#id_username", DAVE.uid)
    page.fill("#id_password", DAVE.password)
    page.click("button:has-text('Log in')")
    page.wait_for_url(base + "/workers/")
    shot(page, "05-workers-after-ldap")
    dave = User.objects.get(username=DAVE.uid)
    assert sorted(dave.groups.values_list("name", flat=True)) == ["hpc-users"]
    worker = connected(request_in_the_dialog(page, base, certificate_environment, "ldap"), platform)
    assert unix_name_by_pw_ssh(platform, dave, worker, tmp_path) == "pwdave"
    logs_out_and_is_asked_to_log_in_again(page, base, at_provider=False)
