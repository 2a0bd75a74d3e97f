"""A scheduler that exists only in the tests: the least an adapter is. It is registered by the
tests that need it (``schedulers.register``), never found by the registry on its own."""

from __future__ import annotations

from schedulers.base import (
    CommandResult,
    FieldSyntax,
    JobInfo,
    JobSpec,
    Partition,
    QueryResult,
    SchedulerAdapter,
)


class FakeAdapter(SchedulerAdapter):
    name = "fake"
    label = "Fake (tests only)"
    directive_prefix = "#FAKE"
    field_syntax = {"walltime": FieldSyntax("--minutes={value}", r"[1-9][0-9]*")}
    allowed_options = frozenset({"minutes"})
    job_id_variable = ""

    @classmethod
    def parse_walltime(cls, value: str) -> int | None:
        return int(value) * 60 if value.isdigit() and int(value) > 0 else None

    @classmethod
    def format_walltime(cls, seconds: int) -> str:
        return str(max(1, seconds // 60))

    @classmethod
    def option_of(cls, directive: str) -> str | None:
        option, _, value = directive.removeprefix("--").partition("=")
        return option if directive.startswith("--") and value.isdigit() else None

    def header_directives(self, spec: JobSpec) -> list[str]:
        return [f"--name={spec.name}"]

    def submit(self, spec: JobSpec) -> str:
        raise NotImplementedError("the fake scheduler runs no jobs")

    def find_job(self, name: str) -> str | None:
        return None

    def query(self, job_ids: list[str]) -> QueryResult:
        return QueryResult(jobs={})

    def final_state(self, job_id: str) -> JobInfo | None:
        return None

    def cancel(self, job_id: str) -> None:
        return None

    def list_platform_jobs(self, prefix: str) -> dict[str, str]:
        return {}

    def partitions(self) -> list[Partition]:
        return [Partition(name="all", nodes_total=1, nodes_available=1, is_default=True)]

    def run_in_job(
        self,
        job_id: str,
        argv: list[str],
        *,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> CommandResult:
        raise NotImplementedError("the fake scheduler runs no jobs")

    def interactive_command(self, job_id: str, argv: list[str], *, pty: bool) -> str:
        raise NotImplementedError("the fake scheduler runs no jobs")

    @classmethod
    def interactive_failure(cls, output: str) -> str | None:
        return None
