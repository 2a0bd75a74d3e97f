"""Each drill and benchmark says what it ran: the processes, and the settings that differ from
the shipped ones."""

from __future__ import annotations

from pathlib import Path

from harness.platform import (
    PRODUCTION_KNOBS,
    SHIPPED,
    SLIM,
    Platform,
    settings_said,
    started_processes,
)


def test_settings_said_names_each_knob_that_differs_from_the_shipped_one(tmp_path: Path) -> None:
    said = settings_said(Platform(workdir=tmp_path, knobs={"ACTIVATE_EXEC_THREADS": "4"}).env())
    assert said.startswith("test settings (the shipped ones but for a fixed secret key")
    assert "ACTIVATE_HEARTBEAT_TIMEOUT=6 (shipped 120)" in said
    assert "ACTIVATE_EXEC_THREADS=4" in said
    # Where things listen is not a setting of behaviour.
    assert "ACTIVATE_BIND" not in said and "ACTIVATE_PUBLIC_URL" not in said


def test_the_shipped_knobs_are_not_listed(tmp_path: Path) -> None:
    environ = Platform(workdir=tmp_path, knobs=dict(PRODUCTION_KNOBS), shape=SHIPPED).env()
    environ["DJANGO_SETTINGS_MODULE"] = "activate.settings.prod"
    assert settings_said(environ) == "prod settings"


def test_a_slim_platforms_processes_and_pools_are_said(tmp_path: Path) -> None:
    said = settings_said(Platform(workdir=tmp_path, shape=SLIM).env())
    assert "ACTIVATE_WEB_WORKERS=1 (shipped 2)" in said
    assert "ACTIVATE_CELERY_CONCURRENCY=2 (shipped 4)" in said


def test_what_a_run_started_is_said_once(tmp_path: Path) -> None:
    started_processes()  # what earlier tests started, in this process
    platform = Platform(workdir=tmp_path)
    platform._spawn("worker", ["true"], platform.env(), "start.sh worker")
    platform.processes["worker"].wait()
    platform._spawn("beat", ["true"], platform.env(), "start.sh beat")
    platform.processes["beat"].wait()
    lines = started_processes()
    assert lines[:2] == ["ran worker: start.sh worker", "ran beat: start.sh beat"]
    assert len(lines) == 3 and lines[2].startswith("all on test settings (")
    assert started_processes() == []
    environ = {**platform.env(), "ACTIVATE_EXEC_THREADS": "4"}
    platform._spawn("web", ["true"], environ, "start.sh web")
    platform._spawn("worker", ["true"], platform.env(), "start.sh worker")
    for process in platform.processes.values():
        process.wait()
    web, worker = started_processes()
    assert "ACTIVATE_EXEC_THREADS=4" in web and "ACTIVATE_EXEC_THREADS" not in worker


def test_a_secret_setting_is_said_as_set_without_its_value(tmp_path: Path) -> None:
    knobs = {"ACTIVATE_SECRET_KEY": "s3cret-value-of-the-run", "ACTIVATE_METRICS_TOKEN": "t0ken-v"}
    said = settings_said(Platform(workdir=tmp_path, knobs=knobs).env())
    assert "ACTIVATE_SECRET_KEY set" in said and "ACTIVATE_METRICS_TOKEN set" in said
    assert "s3cret-value-of-the-run" not in said and "t0ken-v" not in said
