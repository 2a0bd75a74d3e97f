"""A plain machine with no scheduler, reached over SSH: jobs are detached process groups.

Each job lives in ``~/.activate-jobs/<job id>/``: ``name``, ``script``, ``limit`` (seconds),
``wrapper`` (pid of the detached session leader), ``pid`` (pid of ``timeout``, which leads the
job's own process group), ``output``, and when it ends ``exit`` (its status), plus
``timedout`` if ``timeout`` ended it or ``cancelled`` if we did. Ended job directories are
removed after RETENTION_DAYS, so final states stay readable for a week.

The remote side needs a POSIX ``sh``, ``setsid`` and GNU ``timeout``; the remote scripts are
multi-line ``sh -c`` arguments, so the account's login shell must be POSIX-like (not csh).
"""

from __future__ import annotations

import logging
import re
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import replace

from schedulers.base import (
    JOB_ID_VARIABLE,
    SAFE_VALUE,
    CommandResult,
    FieldSyntax,
    JobInfo,
    JobSpec,
    Partition,
    Phase,
    QueryFailed,
    QueryResult,
    SchedulerAdapter,
    SchedulerError,
    clock_time,
)

log = logging.getLogger(__name__)

JOBS_DIR = ".activate-jobs"
RETENTION_DAYS = 7
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
WALLTIME = re.compile(r"^([0-9]{1,4}):([0-5][0-9]):([0-5][0-9])$")
WALLTIME_PATTERN = r"[0-9]{1,4}:[0-5][0-9]:[0-5][0-9]"
TIME_OPTION = re.compile(rf"--time={WALLTIME_PATTERN}")
TIMEOUT_EXIT_STATUSES = {"124", "137"}  # timeout's own status; 137 when -k had to KILL
KILL_AFTER = 10  # seconds between TERM and KILL, for timeouts and cancels alike
# `timeout 0` never times out: a zero limit would be a job without end, and a limit of months
# a typo that holds the machine as long.
MAX_WALLTIME = 30 * 24 * 3600

# Runs detached as a session leader; `timeout` puts the job in a process group of its own,
# whose id (= timeout's pid) is what query and cancel use.
WRAPPER = r"""
d=$1; limit=$2
echo $$ >"$d/wrapper"
cd "$HOME" || exit 1
start=$(date +%s)
timeout -k "$3" "$limit" "$d/script" </dev/null >"$d/output" 2>&1 &
echo $! >"$d/pid.tmp" && mv -f "$d/pid.tmp" "$d/pid"
wait $!
rc=$?
end=$(date +%s)
case $rc in
124|137) if [ "$limit" -gt 0 ] && [ $((end - start)) -ge "$limit" ]; then : >"$d/timedout"; fi ;;
esac
echo "$rc" >"$d/exit.tmp" && mv -f "$d/exit.tmp" "$d/exit"
"""

SUBMIT = r"""
set -e
id=$1; name=$2; limit=$3; kill_after=$4; wrapper=$5; retention=$6
root="$HOME/.activate-jobs"
mkdir -p "$root"
chmod 700 "$root"
find "$root" -mindepth 2 -maxdepth 2 -name exit -mtime +"$retention" 2>/dev/null |
  while read -r f; do rm -rf "${f%/exit}"; done
d="$root/$id"
mkdir "$d"
cat >"$d/script"
chmod 700 "$d/script"
printf '%s\n' "$name" >"$d/name"
printf '%s\n' "$limit" >"$d/limit"
setsid sh -c "$wrapper" activate-job "$d" "$limit" "$kill_after" </dev/null >/dev/null 2>&1 &
i=0
until [ -s "$d/pid" ] || [ -f "$d/exit" ]; do
  i=$((i + 1))
  if [ "$i" -gt 200 ]; then echo "job $id did not start" >&2; exit 1; fi
  sleep 0.05
done
pg=$(cat "$d/pid" 2>/dev/null || true)
i=0
while [ -n "$pg" ] && [ ! -f "$d/exit" ] && ! kill -0 -"$pg" 2>/dev/null; do
  i=$((i + 1))
  if [ "$i" -gt 100 ]; then break; fi
  sleep 0.02
done
echo "submitted $id"
"""

# One line per job: job<TAB>id<TAB>alive<TAB>exit<TAB>flags<TAB>name, then "end" so that a
# cut-off answer is never mistaken for a short list.
LIST = r"""
root="$HOME/.activate-jobs"
printf 'host\t%s\n' "$(uname -n)"
show() {
  d="$root/$1"
  [ -d "$d" ] || return 0
  alive=0
  pg=$(cat "$d/pid" 2>/dev/null || true)
  if [ -n "$pg" ] && kill -0 -"$pg" 2>/dev/null; then alive=1; fi
  w=$(cat "$d/wrapper" 2>/dev/null || true)
  if [ -n "$w" ] && kill -0 "$w" 2>/dev/null; then alive=1; fi
  rc=$(cat "$d/exit" 2>/dev/null || true)
  flags=
  [ -f "$d/timedout" ] && flags="${flags}timedout,"
  [ -f "$d/cancelled" ] && flags="${flags}cancelled,"
  name=$(head -n 1 "$d/name" 2>/dev/null || true)
  printf 'job\t%s\t%s\t%s\t%s\t%s\n' "$1" "$alive" "$rc" "$flags" "$name"
}
if [ $# -gt 0 ]; then
  for id in "$@"; do show "$id"; done
elif [ -d "$root" ]; then
  for d in "$root"/*; do [ -d "$d" ] && show "${d##*/}"; done
fi
echo end
"""

CANCEL = r"""
d="$HOME/.activate-jobs/$1"; kill_after=$2
[ -d "$d" ] || exit 0
[ -f "$d/exit" ] && exit 0
: >"$d/cancelled"
i=0
until [ -s "$d/pid" ] || [ -f "$d/exit" ]; do
  i=$((i + 1))
  if [ "$i" -gt 100 ]; then w=$(cat "$d/wrapper" 2>/dev/null) && kill -TERM "$w"; exit 0; fi
  sleep 0.05
done
pg=$(cat "$d/pid" 2>/dev/null || true)
[ -n "$pg" ] || exit 0
kill -TERM -"$pg" 2>/dev/null || true
i=0
while kill -0 -"$pg" 2>/dev/null; do
  i=$((i + 1))
  if [ "$i" -gt $((kill_after * 10)) ]; then kill -KILL -"$pg" 2>/dev/null || true; break; fi
  sleep 0.1
done
w=$(cat "$d/wrapper" 2>/dev/null || true)
i=0
while [ -n "$w" ] && kill -0 "$w" 2>/dev/null && [ "$i" -lt $((kill_after * 10)) ]; do
  i=$((i + 1)); sleep 0.1
done
"""


def walltime_seconds(value: str) -> int:
    match = WALLTIME.fullmatch(value)
    if match is None:
        raise SchedulerError(f"wall time {value!r} is not HH:MM:SS")
    hours, minutes, seconds = (int(part) for part in match.groups())
    limit = hours * 3600 + minutes * 60 + seconds
    if not 0 < limit <= MAX_WALLTIME:
        raise SchedulerError(
            f"wall time {value} must be more than zero and at most {MAX_WALLTIME // 3600}:00:00"
            f" ({MAX_WALLTIME // 86400} days)"
        )
    return limit


def parse_header(script: str) -> tuple[str, int]:
    """Job name and time limit (seconds, 0 = none) from the script's #ACTIVATE lines."""
    name = ""
    limit = 0
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            break
        if not line.startswith(f"{HostAdapter.directive_prefix} "):
            continue
        option = line.removeprefix(f"{HostAdapter.directive_prefix} ").strip()
        if option.startswith("--job-name="):
            name = option.removeprefix("--job-name=")
        elif option.startswith("--time="):
            limit = walltime_seconds(option.removeprefix("--time="))
    if not SAFE_VALUE.fullmatch(name):
        raise SchedulerError("the script names no valid job (#ACTIVATE --job-name=...)")
    return name, limit


def parse_listing(stdout: str) -> tuple[str, dict[str, JobInfo]]:
    lines = stdout.splitlines()
    if not lines or lines[-1] != "end":
        raise QueryFailed("the job listing was cut off")
    host = ""
    jobs: dict[str, JobInfo] = {}
    for line in lines[:-1]:
        fields = line.split("\t")
        if fields[0] == "host" and len(fields) == 2:
            host = fields[1]
            continue
        if fields[0] != "job" or len(fields) != 6:
            raise QueryFailed(f"unexpected job listing line: {line[:200]!r}")
        _, job_id, alive, exit_status, flags, name = fields
        if alive not in {"0", "1"} or not (exit_status == "" or exit_status.lstrip("-").isdigit()):
            raise QueryFailed(f"unexpected job listing line: {line[:200]!r}")
        jobs[job_id] = _job_info(
            job_id, name, alive == "1", exit_status, set(flags.split(",")), host
        )
    return host, jobs


def _job_info(
    job_id: str, name: str, alive: bool, exit_status: str, flags: set[str], host: str
) -> JobInfo:
    if alive:
        return JobInfo(job_id, name, Phase.RUNNING, "RUNNING", node=host)
    if "timedout" in flags and exit_status in TIMEOUT_EXIT_STATUSES:
        return JobInfo(job_id, name, Phase.ENDED, "TIMEOUT", node=host, exit_code=exit_status)
    if "cancelled" in flags:
        return JobInfo(job_id, name, Phase.ENDED, "CANCELLED", node=host, exit_code=exit_status)
    if exit_status == "":
        # Neither running nor ended by its wrapper: killed with it, or the machine restarted.
        return JobInfo(
            job_id,
            name,
            Phase.ENDED,
            "LOST",
            node=host,
            reason="the job's processes vanished without an exit status",
            failed=True,
        )
    if exit_status == "0":
        return JobInfo(job_id, name, Phase.ENDED, "COMPLETED", node=host, exit_code="0")
    return JobInfo(
        job_id, name, Phase.ENDED, "FAILED", node=host, exit_code=exit_status, failed=True
    )


def new_job_id() -> str:
    return time.strftime("%Y%m%d%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


class HostAdapter(SchedulerAdapter):
    name = "host"
    label = "Plain host (no scheduler)"
    directive_prefix = "#ACTIVATE"
    # No scheduler names the job: its id goes into the script (submit).
    job_id_variable = ""
    allowed_options = frozenset({"time"})
    field_syntax = {"walltime": FieldSyntax("--time={value}", WALLTIME_PATTERN)}

    @classmethod
    def option_of(cls, directive: str) -> str | None:
        return "time" if TIME_OPTION.fullmatch(directive) else None

    @classmethod
    def directive_problem(cls, directive: str, *, set_by_fields: Mapping[str, str]) -> str | None:
        problem = super().directive_problem(directive, set_by_fields=set_by_fields)
        if problem is None:
            try:
                walltime_seconds(directive.removeprefix("--time="))
            except SchedulerError as exc:
                return str(exc)
        return problem

    @classmethod
    def parse_walltime(cls, value: str) -> int | None:
        try:
            return walltime_seconds(value.strip())
        except SchedulerError:
            return None

    @classmethod
    def format_walltime(cls, seconds: int) -> str:
        return clock_time(seconds)

    def header_directives(self, spec: JobSpec) -> list[str]:
        return [f"--job-name={spec.name}"]

    def submit(self, spec: JobSpec) -> str:
        job_id = new_job_id()
        script = self.render_script(
            replace(spec, environment={**spec.environment, JOB_ID_VARIABLE: job_id})
        )
        name, limit = parse_header(script)
        result = self.runner.run(
            [
                "sh",
                "-c",
                SUBMIT,
                "activate-submit",
                job_id,
                name,
                str(limit),
                str(KILL_AFTER),
                WRAPPER,
                str(RETENTION_DAYS),
            ],
            stdin=script,
        )
        if result.exit_status != 0 or f"submitted {job_id}" not in result.stdout:
            raise SchedulerError(
                result.stderr.strip()[:500]
                or f"could not start the job (exit {result.exit_status})"
            )
        return job_id

    def _list(self, job_ids: list[str]) -> dict[str, JobInfo]:
        bad = [job_id for job_id in job_ids if not JOB_ID.fullmatch(job_id)]
        if bad:
            raise ValueError(f"not host job ids: {bad[:5]!r}")
        result = self.runner.run(["sh", "-c", LIST, "activate-list", *job_ids])
        if result.exit_status != 0:
            raise QueryFailed(
                f"listing jobs failed (exit {result.exit_status}): {result.stderr.strip()[:300]}"
            )
        if result.stderr.strip():
            log.info("job listing said on stderr: %s", result.stderr.strip()[:300])
        return parse_listing(result.stdout)[1]

    def query(self, job_ids: list[str]) -> QueryResult:
        ids = sorted(set(job_ids))
        if not ids:
            return QueryResult(jobs={})
        jobs = self._list(ids)
        return QueryResult(jobs={k: v for k, v in jobs.items() if k in set(ids)})

    def final_state(self, job_id: str) -> JobInfo | None:
        info = self.query([job_id]).get(job_id)
        if info is not None and info.phase is not Phase.ENDED:
            raise QueryFailed(f"job {job_id} is still {info.state}")
        return info

    def find_job(self, name: str) -> str | None:
        live = [
            info
            for info in self._list([]).values()
            if info.name == name and info.phase is not Phase.ENDED
        ]
        if len(live) > 1:
            log.warning("%d live jobs are named %s", len(live), name)
        return max(live, key=lambda info: info.job_id).job_id if live else None

    def cancel(self, job_id: str) -> None:
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a host job id: {job_id!r}")
        result = self.runner.run(["sh", "-c", CANCEL, "activate-cancel", job_id, str(KILL_AFTER)])
        if result.exit_status != 0:
            raise SchedulerError(
                result.stderr.strip()[:500] or f"cancel exited {result.exit_status}"
            )

    def run_in_job(
        self,
        job_id: str,
        argv: list[str],
        *,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> CommandResult:
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a host job id: {job_id!r}")
        # The host is the node: the command runs beside the job, marked as the job's (the
        # agent counts its CPU and I/O as the job's).
        marked = ["env", f"{JOB_ID_VARIABLE}={job_id}", *argv]
        return self.runner.run(marked, timeout=timeout, output_limit=output_limit)

    def interactive_command(self, job_id: str, argv: list[str], *, pty: bool) -> str:
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a host job id: {job_id!r}")
        mark = f"{JOB_ID_VARIABLE}={job_id}"
        if argv:
            return shlex.join(["env", mark, *argv])
        return f'export {mark}; exec "${{SHELL:-/bin/sh}}" -l'

    @classmethod
    def interactive_failure(cls, output: str) -> str | None:
        # The command runs in the login shell itself: no client stands between to fail.
        return None

    def list_platform_jobs(self, prefix: str) -> dict[str, str]:
        return {
            job_id: info.name
            for job_id, info in self._list([]).items()
            if info.name.startswith(prefix) and info.phase is not Phase.ENDED
        }

    def partitions(self) -> list[Partition]:
        # The machine itself is the one node; it takes another job whenever asked.
        return [Partition(name="local", nodes_total=1, nodes_available=1, is_default=True)]


ADAPTER = HostAdapter
