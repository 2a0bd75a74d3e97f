"""PBS Professional / OpenPBS: qsub, qstat -F json, qdel, qselect and pbsnodes.

No PBS server can run on the test machine, so the parsers are tested against JSON written
from PBS Pro's documented ``qstat -f -F json`` / ``pbsnodes -a -F json`` / ``qstat -Q -f -F
json`` formats and from real outputs published by PBS sites (tests/schedulers/data/pbs_*).
``qstat -x`` also lists finished jobs (state F, with Exit_status) while the server keeps job
history; an id the server does not know is reported as "qstat: Unknown Job Id ID" on stderr,
which is a definite "not listed" for that id and nothing else.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from typing import Any

from schedulers.base import (
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

# PBS job_state letters (qstat(1B)).
STATES: dict[str, tuple[str, Phase]] = {
    "Q": ("QUEUED", Phase.QUEUED),
    "H": ("HELD", Phase.QUEUED),
    "W": ("WAITING", Phase.QUEUED),  # waiting for its requested start time
    "T": ("TRANSIT", Phase.QUEUED),
    "S": ("SUSPENDED", Phase.QUEUED),
    "U": ("SUSPENDED", Phase.QUEUED),  # suspended: workstation busy
    # Moved to another server; it lives on there under another id, so it is not ended here.
    "M": ("MOVED", Phase.QUEUED),
    "R": ("RUNNING", Phase.RUNNING),
    "B": ("BEGUN", Phase.RUNNING),  # array job with running subjobs
    "E": ("EXITING", Phase.RUNNING),  # ending; Exit_status is not final yet
    "F": ("FINISHED", Phase.ENDED),
    "X": ("FINISHED", Phase.ENDED),  # finished subjob
}

# Exit_status values below 0 are PBS's own (JOB_EXEC_* in job.h).
JOB_EXEC_KILL_WALLTIME = -29
OUT_OF_MEMORY_STATUSES = {-26, -27}  # JOB_EXEC_KILL_VMEM, JOB_EXEC_KILL_MEM

JOB_ID = re.compile(r"^[0-9]+(?:\[[0-9]*\])?(?:\.[A-Za-z0-9_.-]+)?$")
NAME_ARGUMENT = re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]*$")
# The account's unfinished jobs named $1 (qselect without -x).
OWN_JOBS_NAMED = 'exec qselect -u "$(id -un)" -N "$1"'
UNKNOWN_JOB = re.compile(r"^qstat: Unknown Job Id (\S+)$")
WALLTIME_PATTERN = r"[0-9]+:[0-5][0-9]:[0-5][0-9]|[0-9]+"
# pbs_resources(7B) durations: [[hours:]minutes:]seconds[.milliseconds].
WALLTIME = re.compile(r"^(?:(?:([0-9]+):)?([0-9]+):)?([0-9]+)(?:\.[0-9]+)?$")
# What OpenSSH's client says when it cannot run a command on the node at all (the program's
# own errors never start like this): no such host, no connection, a refused key or login.
SSH_FAILURE = re.compile(r"^ssh: |^Host key verification failed\.|(?:^|: )Permission denied \(")

# What users may set in raw directives: a few plain options, and resources of -l by name.
# Never: the name (it carries the worker id), output, the queue (the environment's), arrays,
# interactive or blocking jobs (-W block), exported variables (-v, -V), the shell, the prefix.
ALLOWED_OPTIONS = frozenset(
    ["-A", "-a", "-m", "-M", "-p", "-r"]
    + [
        f"-l {resource}"
        for resource in "mem vmem ncpus ngpus mpiprocs ompthreads place select walltime".split()
    ]
)
# One option per line; -l takes one resource (a comma would smuggle a second one in).
OPTION = re.compile(r"(-[A-Za-z])(?: ([A-Za-z0-9_.:,=@%+/\-\[\]]+))?")
RESOURCE = re.compile(r"([a-z_]+)=[A-Za-z0-9_.:=@%+/\-\[\]]+")


def short_id(job_id: str) -> str:
    """ "123.server" and "123" name the same job for qstat."""
    return job_id.split(".", 1)[0]


def first_exec_host(exec_host: str) -> str:
    """ "node7/0*2+node8/0*2" -> "node7"."""
    return exec_host.split("+", 1)[0].split("/", 1)[0].strip() if exec_host else ""


def walltime_seconds(value: str) -> int | None:
    match = WALLTIME.fullmatch(value.strip())
    if match is None:
        return None
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _json_output(result: CommandResult, what: str) -> dict[str, Any]:
    text = result.stdout.strip()
    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise QueryFailed(f"{what} printed JSON that does not parse: {exc}") from None
    if not isinstance(data, dict):
        raise QueryFailed(f"{what} printed JSON that is not an object")
    return data


def _section(data: dict[str, Any], key: str, what: str) -> dict[str, dict[str, Any]]:
    # PBS leaves the section out entirely when nothing matched.
    section = data.get(key, {})
    if not isinstance(section, dict) or not all(isinstance(v, dict) for v in section.values()):
        raise QueryFailed(f"{what}: {key!r} is not an object of objects")
    return section


def job_info(job_id: str, attributes: dict[str, Any]) -> JobInfo:
    letter = attributes.get("job_state")
    if not isinstance(letter, str) or not letter:
        raise QueryFailed(f"job {job_id} has no job_state")
    name = str(attributes.get("Job_Name", ""))
    node = first_exec_host(str(attributes.get("exec_host", "")))
    reason = str(attributes.get("comment", ""))
    known = STATES.get(letter)
    if known is None:
        log.warning("unknown PBS job state %r of %s; treating the job as live", letter, job_id)
        phase = Phase.RUNNING if node else Phase.QUEUED
        return JobInfo(job_id, name, phase, letter, node=node, reason=reason)
    state, phase = known
    if phase is not Phase.ENDED:
        return JobInfo(job_id, name, phase, state, node=node, reason=reason)
    raw_status = attributes.get("Exit_status")
    if raw_status is None:
        # Deleted before it ever ran.
        return JobInfo(job_id, name, phase, "CANCELLED", node=node, reason=reason)
    try:
        status = int(raw_status)
    except (TypeError, ValueError):
        raise QueryFailed(f"job {job_id} has Exit_status {raw_status!r}") from None
    if status == 0:
        state, failed = "COMPLETED", False
    elif status == JOB_EXEC_KILL_WALLTIME:
        state, failed = "TIMEOUT", False
    elif status in OUT_OF_MEMORY_STATUSES:
        state, failed = "OUT_OF_MEMORY", True
    elif status > 256:
        # Killed by signal (status - 256): qdel, or a walltime kill on older PBS versions.
        state, failed = "KILLED", False
    else:
        state, failed = "FAILED", True
    return JobInfo(
        job_id, name, phase, state, node=node, exit_code=str(status), reason=reason, failed=failed
    )


def parse_qstat_jobs(result: CommandResult, requested: list[str]) -> dict[str, JobInfo]:
    """Parse ``qstat -f -F json -x IDS``; only "Unknown Job Id" of a requested id is tolerated."""
    wanted = {short_id(job_id) for job_id in requested}
    problems = []
    for line in result.stderr.splitlines():
        line = line.strip()
        if not line:
            continue
        unknown = UNKNOWN_JOB.fullmatch(line)
        if unknown is None or short_id(unknown.group(1)) not in wanted:
            problems.append(line)
    if problems:
        raise QueryFailed(f"qstat reported: {'; '.join(problems)[:500]}")
    if result.exit_status != 0 and not result.stderr.strip():
        raise QueryFailed(f"qstat exited {result.exit_status} without saying why")
    jobs: dict[str, JobInfo] = {}
    for job_id, attributes in _section(_json_output(result, "qstat"), "Jobs", "qstat").items():
        jobs[job_id] = job_info(job_id, attributes)
    return jobs


def parse_partitions(
    queues_json: dict[str, Any], nodes_json: dict[str, Any], server_json: dict[str, Any]
) -> list[Partition]:
    """Execution queues with node counts; "free" nodes (idle or partly used) are available."""
    queues = _section(queues_json, "Queue", "qstat -Q")
    nodes = _section(nodes_json, "nodes", "pbsnodes")
    servers = _section(server_json, "Server", "qstat -B")
    default_queue = next(
        (str(s.get("default_queue", "")) for s in servers.values() if s.get("default_queue")), ""
    )
    unassigned = [n for n in nodes.values() if not n.get("queue")]
    partitions = []
    for name, attributes in queues.items():
        if str(attributes.get("queue_type", "")).lower() != "execution":
            continue
        # A queue with nodes of its own runs only there; others share the unassigned nodes.
        members = [n for n in nodes.values() if n.get("queue") == name] or unassigned
        usable = (
            str(attributes.get("enabled")) == "True" and str(attributes.get("started")) == "True"
        )
        resources_max = attributes.get("resources_max") or {}
        partitions.append(
            Partition(
                name=name,
                nodes_total=len(members),
                nodes_available=sum(_node_free(n) for n in members) if usable else 0,
                is_default=name == default_queue,
                max_time=str(resources_max.get("walltime", "")),
            )
        )
    return partitions


def _node_free(node: dict[str, Any]) -> bool:
    return set(str(node.get("state", "")).split(",")) == {"free"}


class PbsAdapter(SchedulerAdapter):
    name = "pbs"
    label = "PBS Pro"
    directive_prefix = "#PBS"
    job_id_variable = "PBS_JOBID"
    unavailable_markers = (
        "Cannot connect to server",
        "cannot connect to server",
        "pbs_iff",
        "Connection refused",
        "timed out",
    )
    allowed_options = ALLOWED_OPTIONS
    # PBS has no QOS; the nearest (a queue) is the environment's partition, so no field.
    field_syntax = {
        "walltime": FieldSyntax("-l walltime={value}", WALLTIME_PATTERN),
        "numNodes": FieldSyntax("-l select={value}"),
        "account": FieldSyntax("-A {value}"),
        "directives": FieldSyntax(example="-l mem=4gb"),
    }

    @classmethod
    def option_of(cls, directive: str) -> str | None:
        match = OPTION.fullmatch(directive)
        if match is None:
            return None
        flag, value = match.groups()
        if flag != "-l":
            return flag
        resource = RESOURCE.fullmatch(value or "")
        return f"-l {resource.group(1)}" if resource else None

    @classmethod
    def parse_walltime(cls, value: str) -> int | None:
        return walltime_seconds(value)

    @classmethod
    def format_walltime(cls, seconds: int) -> str:
        return clock_time(seconds)

    def header_directives(self, spec: JobSpec) -> list[str]:
        # Output is discarded for the reasons given in SlurmAdapter.header_directives.
        directives = [f"-N {spec.name}"]
        if spec.partition:
            directives.append(f"-q {spec.partition}")
        directives += ["-j oe", "-o /dev/null"]
        if not any(d.startswith("-l select=") for d in spec.directives):
            directives.append("-l select=1")
        return directives

    def submit_options(self, spec: JobSpec) -> list[str]:
        options = ["-N", spec.name, "-j", "oe", "-o", "/dev/null"]
        if spec.partition:
            options += ["-q", spec.partition]
        return options

    def submit(self, spec: JobSpec) -> str:
        script = self.render_script(spec)
        result = self.runner.run(["qsub", *self.submit_options(spec)], stdin=script)
        if result.exit_status != 0:
            raise self.refusal("qsub", result)
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        if not lines or not JOB_ID.fullmatch(lines[-1]):
            raise SchedulerError(f"unexpected qsub output: {result.stdout[:200]!r}")
        return lines[-1]

    def _check_ids(self, job_ids: list[str]) -> None:
        bad = [job_id for job_id in job_ids if not JOB_ID.fullmatch(job_id)]
        if bad:
            raise ValueError(f"not PBS job ids: {bad[:5]!r}")

    def query(self, job_ids: list[str]) -> QueryResult:
        self._check_ids(job_ids)
        ids = sorted(set(job_ids))
        if not ids:
            return QueryResult(jobs={})
        result = self.runner.run(["qstat", "-f", "-F", "json", "-x", *ids])
        listed = parse_qstat_jobs(result, ids)
        by_short = {short_id(job_id): info for job_id, info in listed.items()}
        jobs = {}
        for job_id in ids:
            info = listed.get(job_id) or by_short.get(short_id(job_id))
            if info is not None:
                jobs[job_id] = JobInfo(
                    job_id=job_id,
                    name=info.name,
                    phase=info.phase,
                    state=info.state,
                    node=info.node,
                    exit_code=info.exit_code,
                    reason=info.reason,
                    failed=info.failed,
                )
        return QueryResult(jobs=jobs)

    def final_state(self, job_id: str) -> JobInfo | None:
        info = self.query([job_id]).get(job_id)
        if info is not None and info.phase is not Phase.ENDED:
            raise QueryFailed(f"job {job_id} is still {info.state}")
        return info

    def find_job(self, name: str) -> str | None:
        if not NAME_ARGUMENT.fullmatch(name):
            raise ValueError(f"not a PBS job name: {name!r}")
        # Unfinished jobs of the account only: anyone on the cluster can name a job like ours.
        result = self.runner.run(["sh", "-c", OWN_JOBS_NAMED, "qselect", name])
        if result.exit_status != 0 or result.stderr.strip():
            raise QueryFailed(f"qselect failed: {result.stderr.strip()[:500]}")
        ids = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        if any(not JOB_ID.fullmatch(job_id) for job_id in ids):
            raise QueryFailed(f"unexpected qselect output: {result.stdout[:200]!r}")
        if len(ids) > 1:
            log.warning("%d live jobs are named %s", len(ids), name)
        return max(ids, key=lambda job_id: int(re.split(r"[.\[]", job_id)[0])) if ids else None

    def cancel(self, job_id: str) -> None:
        self._check_ids([job_id])
        result = self.runner.run(["qdel", job_id])
        if result.exit_status == 0:
            return
        stderr = result.stderr
        if "Unknown Job Id" in stderr or "Job has finished" in stderr:
            return
        raise SchedulerError(stderr.strip() or f"qdel exited {result.exit_status}")

    def _running_node(self, job_id: str) -> str:
        self._check_ids([job_id])
        info = self.query([job_id]).get(job_id)
        if info is None or info.phase is not Phase.RUNNING or not info.node:
            raise SchedulerError(f"job {job_id} is not running on a node")
        if not SAFE_VALUE.fullmatch(info.node):
            raise ValueError(f"not a node name: {info.node!r}")
        return info.node

    def run_in_job(
        self,
        job_id: str,
        argv: list[str],
        *,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> CommandResult:
        node = self._running_node(job_id)
        # PBS Pro sites allow SSH from the login node to nodes that run one's own job. ssh
        # hands its command to the node's shell, so argv goes as one quoted word: the node's
        # shell then parses it exactly once, back into argv.
        return self.runner.run(
            ["ssh", "-o", "BatchMode=yes", node, "--", shlex.join(argv)],
            timeout=timeout,
            output_limit=output_limit,
        )

    def interactive_command(self, job_id: str, argv: list[str], *, pty: bool) -> str:
        node = self._running_node(job_id)
        ssh = ["ssh", "-tt" if pty else "-T", "-o", "BatchMode=yes", node]
        return shlex.join([*ssh, "--", shlex.join(argv)] if argv else ssh)

    @classmethod
    def interactive_failure(cls, output: str) -> str | None:
        failures = [line for line in output.splitlines() if SSH_FAILURE.search(line.strip())]
        return failures[-1].strip() if failures else None

    def list_platform_jobs(self, prefix: str) -> dict[str, str]:
        # Jobs of the cluster account only; qselect without -x lists unfinished ones.
        ids_result = self.runner.run(["sh", "-c", 'exec qselect -u "$(id -un)"'])
        if ids_result.exit_status != 0 or ids_result.stderr.strip():
            raise QueryFailed(f"qselect failed: {ids_result.stderr.strip()[:500]}")
        ids = [line.strip() for line in ids_result.stdout.splitlines() if line.strip()]
        if any(not JOB_ID.fullmatch(job_id) for job_id in ids):
            raise QueryFailed(f"unexpected qselect output: {ids_result.stdout[:200]!r}")
        return {
            job_id: info.name
            for job_id, info in self.query(ids).jobs.items()
            if info.name.startswith(prefix) and info.phase is not Phase.ENDED
        }

    def partitions(self) -> list[Partition]:
        outputs = []
        for argv in (
            ["qstat", "-Q", "-f", "-F", "json"],
            ["pbsnodes", "-a", "-F", "json"],
            ["qstat", "-B", "-f", "-F", "json"],
        ):
            result = self.runner.run(argv)
            if result.exit_status != 0:
                raise QueryFailed(f"{argv[0]} failed: {result.stderr.strip()[:500]}")
            outputs.append(_json_output(result, " ".join(argv[:2])))
        return parse_partitions(*outputs)


ADAPTER = PbsAdapter
