"""Slurm: sbatch, squeue, sacct/scontrol, scancel and sinfo, parsed strictly.

Real output these parsers were written against (Slurm 22.05, see tests/schedulers/data/):
``squeue --states=all -j A,B`` lists the known ids and silently skips unknown or purged ones
(exit 0), but with a single unknown id it exits 1 with "slurm_load_jobs error: Invalid job id
specified"; that one message is a definite "not listed", anything else is a failed query.
"""

from __future__ import annotations

import logging
import re
import secrets
import shlex
from dataclasses import replace

from schedulers.base import (
    ENVIRONMENT_DIR,
    JOBS_FOLDER,
    CommandResult,
    FieldSyntax,
    JobInfo,
    JobSpec,
    Outcomes,
    Partition,
    Phase,
    Prepare,
    QueryFailed,
    QueryResult,
    SchedulerAdapter,
    SchedulerError,
    SchedulerUnavailable,
    SubmitLoop,
    clock_time,
    environment_file,
    equal_shares,
    reads_environment,
    send_at_once,
    shell_answer,
    shell_part,
    shell_shared,
    submit_command,
    submit_program,
    task_key,
)

log = logging.getLogger(__name__)

# Phase and failure of every job state Slurm documents (squeue(1) "JOB STATE CODES"), plus the
# flag-states newer versions print. Unknown states are logged and kept live, never ended.
STATES: dict[str, tuple[Phase, bool]] = {
    "PENDING": (Phase.QUEUED, False),
    # Resources allocated, nodes still booting: the script has not started yet.
    "CONFIGURING": (Phase.QUEUED, False),
    "POWER_UP_NODE": (Phase.QUEUED, False),
    "RUNNING": (Phase.RUNNING, False),
    # The script ended but epilogs/stage-out still run; the final state comes next.
    "COMPLETING": (Phase.RUNNING, False),
    "STAGE_OUT": (Phase.RUNNING, False),
    "SIGNALING": (Phase.RUNNING, False),
    "RESIZING": (Phase.RUNNING, False),
    # Stopped or suspended jobs keep their id and resume later: back in the queue, not ended.
    "SUSPENDED": (Phase.QUEUED, False),
    "STOPPED": (Phase.QUEUED, False),
    "REQUEUED": (Phase.QUEUED, False),
    "REQUEUE_HOLD": (Phase.QUEUED, False),
    "REQUEUE_FED": (Phase.QUEUED, False),
    "RESV_DEL_HOLD": (Phase.QUEUED, False),
    "SPECIAL_EXIT": (Phase.QUEUED, False),
    "LAUNCH_FAILED": (Phase.QUEUED, False),
    "RECONFIG_FAIL": (Phase.QUEUED, False),
    "UPDATE_DB": (Phase.QUEUED, False),
    "COMPLETED": (Phase.ENDED, False),
    "CANCELLED": (Phase.ENDED, False),
    "TIMEOUT": (Phase.ENDED, False),
    # Final only when the preemption mode cancels; a requeued job shows REQUEUED/PENDING instead.
    "PREEMPTED": (Phase.ENDED, False),
    # A federation sibling started the job elsewhere; this copy is gone.
    "REVOKED": (Phase.ENDED, False),
    "FAILED": (Phase.ENDED, True),
    "NODE_FAIL": (Phase.ENDED, True),
    "OUT_OF_MEMORY": (Phase.ENDED, True),
    "BOOT_FAIL": (Phase.ENDED, True),
    "DEADLINE": (Phase.ENDED, True),
}

# Ours: a job, or a task of a job array ("12_3", as squeue's JobArrayID names it).
JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?$")
ARRAY_TASK = re.compile(r"^([0-9]+)_([0-9]+)$")
# squeue prints array and heterogeneous job ids as 12_3 / 12+0; ours are plain.
LISTED_JOB_ID = re.compile(r"^[0-9]+(?:[_+][0-9\[\]\-,%]+)?$")
STATE_WORD = re.compile(r"^[A-Z][A-Z_]*$")
SBATCH_OUTPUT = re.compile(r"^([0-9]+)(?:;[A-Za-z0-9_.-]+)?$")
WALLTIME_PATTERN = (
    r"[0-9]+|[0-9]+:[0-5]?[0-9]|[0-9]+:[0-5]?[0-9]:[0-5]?[0-9]"
    r"|[0-9]+-[0-9]{1,2}|[0-9]+-[0-9]{1,2}:[0-5]?[0-9]|[0-9]+-[0-9]{1,2}:[0-5]?[0-9]:[0-5]?[0-9]"
)
# sbatch(1) --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
WALLTIME = re.compile(
    r"^(?:(?P<days>[0-9]+)-(?P<dh>[0-9]+)(?::(?P<dm>[0-9]+)(?::(?P<ds>[0-9]+))?)?"
    r"|(?P<a>[0-9]+)(?::(?P<b>[0-9]+)(?::(?P<c>[0-9]+))?)?)$"
)
# A job name squeue --name can take (a comma would make it a list).
NAME_ARGUMENT = re.compile(r"^[A-Za-z0-9_.:=@%+/\-\[\]]+$")

# Full names of the sbatch options users may set in raw directives. Never: the job's name
# (it carries the worker id), output and error, partition (the environment's), arrays, a
# different cluster, user or working directory, blocking or test-only submission.
ALLOWED_OPTIONS = frozenset(
    """account begin comment constraint contiguous core-spec cores-per-socket cpu-freq
    cpus-per-gpu cpus-per-task deadline distribution exclude exclusive extra-node-info gpu-bind
    gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint licenses
    mail-type mail-user mem mem-bind mem-per-cpu mem-per-gpu mincpus network nice nodelist nodes
    no-requeue ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket
    overcommit oversubscribe power priority qos requeue reservation signal sockets-per-node
    spread-job switches threads-per-core time time-min tmp wckey""".split()
)
LONG_OPTION = re.compile(r"--([a-z][a-z0-9-]*)(?:=[A-Za-z0-9_.:,=@%+/\-\[\]]+)?")

# JobArrayID is a plain job's id, and a task's "ARRAY_TASK" (JobID is a task's own number, which
# the pending tasks of an array share). Every listing passes --array: one line per task.
QUERY_FORMAT = "JobArrayID:|,State:|,NodeList:|,Reason:|,exit_code:|,Name:"
QUERY_FIELDS = 6
# Up to this many ids a poll names them; past it (a few KB of argument) it lists the account's
# jobs with --me (Slurm 20.11+) instead, so a poll is one command however many jobs are live.
QUERY_CHUNK = 500
NOT_FOUND = "Invalid job id specified"
# Several jobs per command (base.SubmitLoop): on stdin each job is a line "NAME PARTITION SIZE
# [ARRAY]" (partition "-" for none; ARRAY the indices of a job array, e.g. 0-199) and then its
# script's SIZE bytes. A line "#file FILE SIZE" and SIZE bytes is a file for the account's jobs
# folder (a task's environment, 0600): a job after a file that could not be written is not
# submitted. Names, partitions and files are checked (check_spec, ARRAY_NAME) to hold no
# whitespace, "/" or shell metacharacters; they are still quoted where used.
SUBMIT_MARKER = "@@activate-sbatch-exit"
FILE = "#file"
SUBMIT_LOOP = (
    f'export LC_ALL=C; umask 077; dir="{ENVIRONMENT_DIR}"; shared=; unwritten=; '
    "while read -r name partition size array; do "
    + shell_shared("partition")
    + shell_part("script", "size")
    + f'if [ "$name" = "{FILE}" ]; then case "$partition" in */*|.*) unwritten=1;; '
    '*) { mkdir -p "$dir" && printf \'%s\' "$script" > "$dir/$partition"; } || unwritten=1;; '
    "esac; continue; fi; "
    + 'script="$script$shared"; '
    + 'if [ -n "$unwritten" ]; then unwritten=; echo "a job environment could not be written"; '
    "false; else "
    + 'if [ "$partition" = - ]; then set --; else set -- "--partition=$partition"; fi; '
    + 'if [ -n "$array" ]; then set -- "$@" "--array=$array"; fi; '
    'printf \'%s\' "$script" | sbatch --parsable "--job-name=$name" '
    '--output=/dev/null --error=/dev/null "$@" 2>&1; fi; ' + shell_answer(SUBMIT_MARKER) + "done"
)
SUBMIT_PROGRAM = submit_program(
    SUBMIT_MARKER,
    f"""
os.umask(0o077)
directory = os.environ.get("HOME", "") + {JOBS_FOLDER!r}
unwritten = ""
for words, (data,) in records([2]):
    if words[0] == {FILE!r}:
        try:
            if "/" in words[1] or words[1].startswith("."):
                raise OSError("not a plain file name")
            os.makedirs(directory, exist_ok=True)
            path = "%s/%s" % (directory, words[1])
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
            with os.fdopen(os.open(path, flags, 0o600), "wb") as f:
                f.write(data)
        except OSError as exc:
            unwritten = unwritten or "the job environment %s could not be written: %s" % (
                words[1], exc)
        continue
    if unwritten:
        answer(unwritten, 1)
        unwritten = ""
        continue
    name, partition = words[0], words[1]
    argv = ["sbatch", "--parsable", "--job-name=" + name, "--output=/dev/null", "--error=/dev/null"]
    argv += [] if partition == "-" else ["--partition=" + partition]
    argv += ["--array=" + words[3]] if len(words) > 3 else []
    answer(*run(argv, data))
""",
)
SUBMIT_COMMAND = submit_command(SUBMIT_PROGRAM, SUBMIT_LOOP)
SUBMIT = SubmitLoop("sbatch", SUBMIT_MARKER, SUBMIT_COMMAND, SBATCH_OUTPUT, last_size_at=2)
# Scripts per command: enough that the channel's cost vanishes, few enough that one command
# stays well inside the command timeout on a slow controller. Up to SUBMIT_PARALLEL commands run
# at once (channels of the one connection): each sbatch is mostly its own start-up on the login
# host and a wait on the controller, so several at once overlap those waits (eight against three
# took 200 jobs from 0.55x to 0.77x dask-jobqueue's rate, which runs every sbatch at once;
# docs/benchmarks.md). A batch is dealt in equal shares, none left to run alone at the end. 64
# lets the largest request (500) go in one round of 8 commands: 1.29-1.31 s in-process, against
# 1.40-1.48 s for two rounds of 8 at 50 (the commands' start-up and the first round's uneven end).
SUBMIT_CHUNK = 64
SUBMIT_PARALLEL = 8
# A bulk request goes as job arrays: one sbatch makes a whole array's jobs (its tasks), where
# a sbatch a job costs the login host ~2.3 ms of CPU and the controller a request each, the
# ceiling of per-job submission (docs/benchmarks.md). Its tasks share one script and name; each
# reads its own environment (its agent's key) from a 0600 file the same command writes. Tasks
# per array: below Slurm's default MaxArraySize (1001); a site's lower limit makes sbatch refuse
# the array, and its jobs then go one sbatch each. A group of jobs alike is one array up to
# ARRAY_TASKS (two arrays of 100 for 200 jobs, keyed one while the other went, took 0.20-0.30 s
# against 0.19 s for one; docs/benchmarks.md); arrays go up to ARRAY_PARALLEL at once, each
# keyed just before its command starts.
ARRAY_TASKS = 500
ARRAY_PARALLEL = 4
ARRAY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# What srun prints when it cannot start or keep a step (its own errors, not the program's).
STEP_ERROR = "srun: error"
# Names per squeue --name (a comma-separated list).
NAME_CHUNK = 100
ACCOUNTING_DISABLED = "accounting storage is disabled"


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: "n[03-05,9],m1" -> "n03"."""
    nodelist = nodelist.strip()
    if not nodelist or nodelist in {"(null)", "None", "N/A"}:
        return ""
    match = re.match(r"^([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if match is None:
        return ""
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def exit_code_from_status(raw: str) -> str:
    """squeue's exit_code is a wait(2) status; Slurm shows it as "code:signal"."""
    status = int(raw)
    return f"{(status >> 8) & 0xFF}:{status & 0x7F}"


def walltime_seconds(value: str) -> int | None:
    """Seconds in a --time value such as ``04:00:00`` or ``1-12``; None if it is not one."""
    match = WALLTIME.fullmatch(value.strip())
    if match is None:
        return None
    parts = match.groupdict()
    if parts["days"] is not None:
        days, hours = int(parts["days"]), int(parts["dh"])
        minutes, seconds = int(parts["dm"] or 0), int(parts["ds"] or 0)
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    a, b, c = parts["a"], parts["b"], parts["c"]
    if c is not None:  # HH:MM:SS
        return int(a) * 3600 + int(b) * 60 + int(c)
    if b is not None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # MM


def format_walltime(seconds: int) -> str:
    """``HH:MM:SS``, or ``D-HH:MM:SS`` from a day on."""
    days, rest = divmod(seconds, 86400)
    return f"{days}-{clock_time(rest)}" if days else clock_time(rest)


def phase_of(state: str, *, node: str = "") -> tuple[Phase, bool]:
    known = STATES.get(state)
    if known is not None:
        return known
    # Never guess an end: an unknown state keeps the job live (running if it has a node).
    log.warning("unknown Slurm job state %r; treating the job as live", state)
    return (Phase.RUNNING if node else Phase.QUEUED), False


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def parse_squeue(stdout: str) -> dict[str, JobInfo]:
    """Parse ``squeue -h -O QUERY_FORMAT`` output. QueryFailed on any line that does not fit."""
    jobs: dict[str, JobInfo] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        fields = line.split("|", QUERY_FIELDS - 1)
        if len(fields) != QUERY_FIELDS:
            raise QueryFailed(f"unexpected squeue line: {line[:200]!r}")
        job_id, state, nodelist, reason, raw_exit, name = (f.strip() for f in fields)
        if (
            not LISTED_JOB_ID.fullmatch(job_id)
            or not STATE_WORD.fullmatch(state)
            or not (raw_exit.isdigit() or raw_exit in {"", "N/A"})
        ):
            raise QueryFailed(f"unexpected squeue line: {line[:200]!r}")
        node = first_host(nodelist)
        phase, failed = phase_of(state, node=node)
        ended = phase is Phase.ENDED and raw_exit.isdigit()
        jobs[job_id] = JobInfo(
            job_id=job_id,
            name=name,
            phase=phase,
            state=state,
            node=node,
            exit_code=exit_code_from_status(raw_exit) if ended else "",
            reason="" if reason == "None" else reason,
            failed=failed,
        )
    return jobs


def parse_sacct(stdout: str, job_id: str) -> JobInfo | None:
    """The job's own line of ``sacct -n -P -o JobID,State,ExitCode,NodeList,JobName``."""
    for line in stdout.splitlines():
        fields = line.split("|")
        if len(fields) < 5 or fields[0] != job_id:
            continue
        # "CANCELLED by 1001" -> CANCELLED
        state = fields[1].split()[0] if fields[1].split() else ""
        if not STATE_WORD.fullmatch(state) or not re.fullmatch(r"[0-9]+:[0-9]+", fields[2]):
            raise QueryFailed(f"unexpected sacct line: {line[:200]!r}")
        node = first_host(fields[3])
        phase, failed = phase_of(state, node=node)
        return JobInfo(
            job_id=job_id,
            name="|".join(fields[4:]),
            phase=phase,
            state=state,
            node=node,
            exit_code=fields[2],
            failed=failed,
        )
    return None


def parse_scontrol(stdout: str, job_id: str) -> JobInfo | None:
    """The job in ``scontrol -o show job ID`` (one line of Key=Value words per job; a task of an
    array is "JobId=OWN ArrayJobId=ARRAY ArrayTaskId=INDEX ...")."""
    task = ARRAY_TASK.fullmatch(job_id)
    own = (
        rf"^JobId=[0-9]+\s+ArrayJobId={task.group(1)}\s+ArrayTaskId={task.group(2)}\s"
        if task
        else rf"^JobId={re.escape(job_id)}\s"
    )
    for line in stdout.splitlines():
        if not re.match(own, line):
            continue
        state = re.search(r"(?:^|\s)JobState=(\S+)", line)
        exit_code = re.search(r"(?:^|\s)ExitCode=([0-9]+:[0-9]+)(?:\s|$)", line)
        if state is None or exit_code is None or not STATE_WORD.fullmatch(state.group(1)):
            raise QueryFailed(f"unexpected scontrol output: {line[:200]!r}")
        nodes = re.search(r"(?:^|\s)NodeList=(\S*)", line)
        reason = re.search(r"(?:^|\s)Reason=(\S+)", line)
        name = re.search(r"(?:^|\s)JobName=(.*?) UserId=", line)
        node = first_host(nodes.group(1) if nodes else "")
        phase, failed = phase_of(state.group(1), node=node)
        return JobInfo(
            job_id=job_id,
            name=name.group(1) if name else "",
            phase=phase,
            state=state.group(1),
            node=node,
            exit_code=exit_code.group(1),
            reason="" if reason is None or reason.group(1) == "None" else reason.group(1),
            failed=failed,
        )
    return None


def _job_number(job_id: str) -> int:
    return int(re.split(r"[_+]", job_id)[0])


def _id_order(job_id: str) -> tuple[int, int]:
    task = ARRAY_TASK.fullmatch(job_id)
    return (int(task.group(1)), int(task.group(2))) if task else (int(job_id), -1)


def listed_key(info: JobInfo) -> str:
    """The key (JobSpec.key) a listed job answers to: a task of an array by its index."""
    task = ARRAY_TASK.fullmatch(info.job_id)
    return task_key(info.name, task.group(2)) if task else info.name


def _task_not_found(result: CommandResult, job_id: str) -> bool:
    """scontrol's answer for a task of a live array that it no longer has (one cancelled while
    pending leaves no record): "Job 12_3 not found", on stdout."""
    said = (result.stdout + result.stderr).strip()
    return bool(ARRAY_TASK.fullmatch(job_id)) and said == f"Job {job_id} not found"


class ArrayRefused(SchedulerError):
    """sbatch refused a job array (a site's MaxArraySize, arrays disabled, ...): nothing was
    made, and its jobs go one by one, each refused or made on its own."""


def parse_submit_loop(stdout: str, adapter: SchedulerAdapter) -> list[str | SchedulerError]:
    """One outcome per marker line of SUBMIT_COMMAND's output, in order."""
    return SUBMIT.outcomes(stdout, adapter)


def parse_sinfo(stdout: str) -> list[Partition]:
    """Parse ``sinfo -h -o %P|%a|%l|%D|%T``: one line per partition and node state."""
    order: list[str] = []
    totals: dict[str, int] = {}
    available: dict[str, int] = {}
    defaults: set[str] = set()
    max_time: dict[str, str] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 5 or not fields[3].isdigit():
            raise QueryFailed(f"unexpected sinfo line: {line[:200]!r}")
        raw_name, avail, limit, count, state = fields
        name = raw_name.rstrip("*")
        if not name:
            raise QueryFailed(f"unexpected sinfo line: {line[:200]!r}")
        if name not in totals:
            order.append(name)
            totals[name] = 0
            available[name] = 0
        if raw_name.endswith("*"):
            defaults.add(name)
        max_time[name] = limit
        totals[name] += int(count)
        if avail == "up" and _node_takes_jobs(state):
            available[name] += int(count)
    return [
        Partition(
            name=name,
            nodes_total=totals[name],
            nodes_available=available[name],
            is_default=name in defaults,
            max_time=max_time[name],
        )
        for name in order
    ]


# Node state flags (sinfo(1)): not responding, powering down, maintenance, rebooting.
UNAVAILABLE_FLAGS = set("*!%$@^")


def _node_takes_jobs(state: str) -> bool:
    """Idle or partly used (mixed) nodes can start a job now; powered-off cloud nodes boot."""
    base = state.rstrip("*~#!%$@^-")
    flags = set(state[len(base) :])
    return base in {"idle", "mixed"} and not flags & UNAVAILABLE_FLAGS


class SlurmAdapter(SchedulerAdapter):
    name = "slurm"
    label = "Slurm"
    directive_prefix = "#SBATCH"
    job_id_variable = "SLURM_JOB_ID"
    unavailable_markers = (
        "Unable to contact slurm controller",
        "Socket timed out",
        "temporarily unable to accept",
        "Transport endpoint is not connected",
        "Zero Bytes were transmitted",
        "Resource temporarily unavailable",
    )
    allowed_options = ALLOWED_OPTIONS
    field_syntax = {
        "walltime": FieldSyntax("--time={value}", WALLTIME_PATTERN),
        "numNodes": FieldSyntax("--nodes={value}"),
        "account": FieldSyntax("--account={value}"),
        "qos": FieldSyntax("--qos={value}"),
        "directives": FieldSyntax(example="--mem=4G"),
    }

    @classmethod
    def option_of(cls, directive: str) -> str | None:
        match = LONG_OPTION.fullmatch(directive)
        return match.group(1) if match else None

    @classmethod
    def parse_walltime(cls, value: str) -> int | None:
        return walltime_seconds(value)

    @classmethod
    def format_walltime(cls, seconds: int) -> str:
        return format_walltime(seconds)

    def header_directives(self, spec: JobSpec) -> list[str]:
        # Output goes nowhere: nobody owns cleaning files in users' home directories, the
        # output could hold the worker's secret, and a missing output directory makes the job
        # fail to launch. End reasons come from the scheduler, not from a log file.
        directives = [f"--job-name={spec.name}"]
        if spec.partition:
            directives.append(f"--partition={spec.partition}")
        directives += ["--output=/dev/null", "--error=/dev/null"]
        if not any(d.startswith("--nodes=") for d in spec.directives):
            directives.append("--nodes=1")
        return directives

    def _run(self, argv: list[str], *, stdin: str | None = None) -> CommandResult:
        return self.runner.run(argv, stdin=stdin)

    def submit_options(self, spec: JobSpec) -> list[str]:
        options = [f"--job-name={spec.name}", "--output=/dev/null", "--error=/dev/null"]
        if spec.partition:
            options.append(f"--partition={spec.partition}")
        return options

    def submit(self, spec: JobSpec) -> str:
        script = self.render_script(spec)
        result = self._run(["sbatch", "--parsable", *self.submit_options(spec)], stdin=script)
        if result.exit_status != 0:
            raise self.refusal("sbatch", result)
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        match = SBATCH_OUTPUT.fullmatch(lines[-1]) if lines else None
        if match is None:
            # The job may exist: the caller finds it by name before submitting again.
            raise SchedulerUnavailable(f"unexpected sbatch output: {result.stdout[:200]!r}")
        return match.group(1)

    def submit_many(
        self, specs: list[JobSpec], *, prepare: Prepare | None = None
    ) -> list[str | SchedulerError]:
        if len(specs) <= 1:
            return super().submit_many(specs, prepare=prepare)
        # Jobs alike but for their environment (the same partition and directives) share arrays.
        alike: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for position, spec in enumerate(specs):
            alike.setdefault((spec.partition, tuple(spec.directives)), []).append(position)
        positions: list[int] = []
        arrays: list[list[JobSpec]] = []
        for group in alike.values():
            for share in equal_shares(group, most=ARRAY_TASKS, parallel=1):
                name = f"{specs[share[0]].name}-{secrets.token_hex(3)}"
                positions += share
                arrays.append([replace(specs[p], array=name, index=i) for i, p in enumerate(share)])
        sent = send_at_once(arrays, self._submit_array, parallel=ARRAY_PARALLEL, prepare=prepare)
        outcomes: list[str | SchedulerError] = [SchedulerUnavailable("not sent")] * len(specs)
        for position, outcome in zip(positions, sent, strict=True):
            outcomes[position] = outcome
        refused = [p for p, outcome in enumerate(outcomes) if isinstance(outcome, ArrayRefused)]
        if refused:
            log.warning("sbatch refused a job array (%s): one job a sbatch", outcomes[refused[0]])
            self._forget_environments({specs[p].name for p in refused}, arrays)
            # Keyed again, as jobs of their own: the array made nothing.
            alone = [replace(specs[p], array="", index=0) for p in refused]
            again = self.submit_each(alone, prepare=prepare)
            for position, outcome in zip(refused, again, strict=True):
                outcomes[position] = outcome
        return outcomes

    def _forget_environments(self, names: set[str], arrays: list[list[JobSpec]]) -> None:
        """Remove the environment files of refused arrays (whose tasks were never made): each
        holds an agent key, and the jobs sent in their place carry their own."""
        refused = [tasks[0].array for tasks in arrays if tasks[0].name in names]
        patterns = " ".join(f'"{ENVIRONMENT_DIR}/{array}".*.env' for array in refused)
        self._run(["sh", "-c", f"rm -f {patterns}"])

    def submit_each(self, specs: list[JobSpec], *, prepare: Prepare | None = None) -> Outcomes:
        """submit_many with one sbatch a job (the login-host loop): where arrays are refused."""
        return self.submit_in_loops(
            specs,
            SUBMIT,
            record=self._record,
            chunk=SUBMIT_CHUNK,
            parallel=SUBMIT_PARALLEL,
            prepare=prepare,
        )

    def _submit_array(self, tasks: list[JobSpec]) -> Outcomes:
        """One command: each task's environment file, then one sbatch for the array."""
        first = tasks[0]
        try:
            if not ARRAY_NAME.fullmatch(first.array):
                raise SchedulerError(f"job array name {first.array!r} is not a plain file name")
            for task in tasks:
                self.check_spec(task)
                if (task.array, task.partition, task.directives, task.command) != (
                    first.array,
                    first.partition,
                    first.directives,
                    first.command,
                ):
                    raise SchedulerError(f"job {task.name!r} differs from its array's script")
        except SchedulerError as exc:
            return [exc] * len(tasks)
        script = reads_environment(
            self.render_script(replace(first, name=first.array, environment={})),
            f'"{ENVIRONMENT_DIR}/{first.array}.${{SLURM_ARRAY_TASK_ID}}.env"',
        )
        records = []
        for task in tasks:
            environment = environment_file(task)
            file = f"{first.array}.{task.index}.env"
            records.append(f"{FILE} {file} {len(environment.encode())}\n{environment}")
        indices = f"{tasks[0].index}-{tasks[-1].index}"
        header = f"{first.array} {first.partition or '-'} {len(script.encode())} {indices}"
        result = self.runner.run(SUBMIT_COMMAND, stdin="".join(records) + f"{header}\n{script}")
        answers = SUBMIT.outcomes(result.stdout, self)
        if not answers:
            unknown = f"no answer for the job array's sbatch: {result.stderr.strip()[:200]}"
            return [SchedulerUnavailable(unknown)] * len(tasks)
        made = answers[0]
        if isinstance(made, str):
            return [f"{made}_{task.index}" for task in tasks]
        if not isinstance(made, SchedulerUnavailable):
            made = ArrayRefused(str(made))
        return [made] * len(tasks)

    def _record(self, spec: JobSpec) -> tuple[list[str], str]:
        script = self.render_script(spec)
        return [spec.name, spec.partition or "-", str(len(script.encode()))], script

    def query(self, job_ids: list[str]) -> QueryResult:
        bad = [job_id for job_id in job_ids if not JOB_ID.fullmatch(job_id)]
        if bad:
            raise ValueError(f"not Slurm job ids: {bad[:5]!r}")
        ids = sorted(set(job_ids), key=_id_order)
        if not ids:
            return QueryResult(jobs={})
        jobs = self._squeue(ids if len(ids) <= QUERY_CHUNK else None)
        wanted = set(ids)
        return QueryResult(jobs={k: v for k, v in jobs.items() if k in wanted})

    def _squeue(self, ids: list[str] | None) -> dict[str, JobInfo]:
        """The named jobs, or with ``None`` every job of the account."""
        selector = f"--jobs={','.join(ids)}" if ids is not None else "--me"
        result = self._run(
            [
                "squeue",
                "--noheader",
                "--array",
                "--states=all",
                selector,
                f"--Format={QUERY_FORMAT}",
            ]
        )
        if result.exit_status != 0:
            if (
                ids is not None
                and len(ids) == 1
                and not result.stdout.strip()
                and [line.strip() for line in result.stderr.splitlines() if line.strip()]
                == [f"slurm_load_jobs error: {NOT_FOUND}"]
            ):
                return {}
            raise QueryFailed(f"squeue exited {result.exit_status}: {result.stderr.strip()[:500]}")
        errors = _error_lines(result.stderr)
        if errors:
            # Slurm can exit 0 after "slurm_load_jobs error: Socket timed out": no answer.
            raise QueryFailed(f"squeue reported: {'; '.join(errors)[:500]}")
        return parse_squeue(result.stdout)

    def find_job(self, name: str) -> str | None:
        return self.find_jobs([name]).get(name)

    def find_jobs(self, names: list[str]) -> dict[str, str]:
        # A key names a job (its name) or a task of an array (the array's name and its index).
        squeue_names = list(dict.fromkeys(re.sub(r"\[[0-9]+\]$", "", key) for key in names))
        bad = [name for name in squeue_names if not NAME_ARGUMENT.fullmatch(name) or "," in name]
        if bad:
            raise ValueError(f"not job names squeue can look up: {bad[:5]!r}")
        wanted = set(names)
        found: dict[str, str] = {}
        for start in range(0, len(squeue_names), NAME_CHUNK):
            chunk = squeue_names[start : start + NAME_CHUNK]
            # The account's own jobs only (--me): anyone on the cluster can name a job like ours.
            result = self._run(
                [
                    "squeue",
                    "--noheader",
                    "--me",
                    "--array",
                    "--states=all",
                    f"--name={','.join(chunk)}",
                    f"--Format={QUERY_FORMAT}",
                ]
            )
            if result.exit_status != 0 or _error_lines(result.stderr):
                raise QueryFailed(f"squeue failed: {result.stderr.strip()[:500]}")
            for info in parse_squeue(result.stdout).values():
                key = listed_key(info)
                if key not in wanted or info.phase is Phase.ENDED:
                    continue
                earlier = found.get(key)
                if earlier is not None:
                    log.warning("more than one live job answers to %s", key)
                    if _id_order(earlier) > _id_order(info.job_id):
                        continue
                found[key] = info.job_id
        return found

    def final_state(self, job_id: str) -> JobInfo | None:
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a Slurm job id: {job_id!r}")
        # sacct and scontrol both take a task of an array as squeue names it (12_3).
        sacct = self._run(
            [
                "sacct",
                "--noheader",
                "--parsable2",
                f"--jobs={job_id}",
                "--format=JobID,State,ExitCode,NodeList,JobName",
            ]
        )
        accounting_failed = ""
        if sacct.exit_status == 0 and not _error_lines(sacct.stderr):
            info = parse_sacct(sacct.stdout, job_id)
            if info is not None and info.phase is Phase.ENDED:
                return info
        elif ACCOUNTING_DISABLED not in sacct.stderr:
            accounting_failed = sacct.stderr.strip()[:300] or f"exit {sacct.exit_status}"
        scontrol = self._run(["scontrol", "--oneliner", "show", "job", job_id])
        if scontrol.exit_status == 0:
            info = parse_scontrol(scontrol.stdout, job_id)
            if info is not None and info.phase is Phase.ENDED:
                return info
            if info is not None:
                raise QueryFailed(f"job {job_id} is still {info.state} according to scontrol")
        elif NOT_FOUND not in scontrol.stderr and not _task_not_found(scontrol, job_id):
            raise QueryFailed(f"scontrol failed: {scontrol.stderr.strip()[:500]}")
        if accounting_failed:
            # Accounting exists but did not answer: its record may still give the real end.
            raise QueryFailed(f"sacct failed: {accounting_failed}")
        return None

    def cancel(self, job_id: str) -> None:
        if not LISTED_JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a Slurm job id: {job_id!r}")
        # A task of one of our arrays (12_3) goes alone; any other array (12_[0-2]) or
        # heterogeneous (12+0) id names a job of someone's making: the whole of it goes.
        target = job_id if ARRAY_TASK.fullmatch(job_id) else job_id.split("_")[0].split("+")[0]
        result = self._run(["scancel", target])
        if result.exit_status == 0:
            return
        stderr = result.stderr
        if NOT_FOUND in stderr or "already completing or completed" in stderr:
            return
        raise self.refusal("scancel", result)

    def run_in_job(
        self,
        job_id: str,
        argv: list[str],
        *,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> CommandResult:
        job_id = self._own_number(job_id)
        # --overlap shares the allocation's resources with the agent's step instead of waiting.
        return self.runner.run(
            ["srun", f"--jobid={job_id}", "--overlap", "--ntasks=1", "--", *argv],
            timeout=timeout,
            output_limit=output_limit,
        )

    def _own_number(self, job_id: str) -> str:
        """The number srun takes for a job: a running task of an array has its own (pending
        tasks share the array's, which a running sibling may hold: never that one)."""
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a Slurm job id: {job_id!r}")
        if not ARRAY_TASK.fullmatch(job_id):
            return job_id
        result = self._run(
            [
                "squeue",
                "--noheader",
                "--array",
                f"--jobs={job_id}",
                "--Format=JobArrayID:|,JobID:|,State:",
            ]
        )
        for line in result.stdout.splitlines():
            fields = [field.strip() for field in line.split("|")]
            if len(fields) == 3 and fields[0] == job_id and fields[1].isdigit():
                if fields[2] != "RUNNING":
                    raise SchedulerError(f"job {job_id} is {fields[2]}, not running")
                return fields[1]
        if result.exit_status != 0 and NOT_FOUND not in result.stderr:
            raise SchedulerUnavailable(f"squeue failed: {result.stderr.strip()[:300]}")
        raise SchedulerError(f"job {job_id} is not running")

    def interactive_command(self, job_id: str, argv: list[str], *, pty: bool) -> str:
        job_id = self._own_number(job_id)
        step = ["srun", f"--jobid={job_id}", "--overlap", "--ntasks=1"]
        if pty:
            step.append("--pty")
        if not argv:
            # The user's shell, as the login host names it: expanded there, not by us.
            return shlex.join([*step, "--"]) + ' "${SHELL:-/bin/sh}" -l'
        return shlex.join([*step, "--", *argv])

    @classmethod
    def interactive_failure(cls, output: str) -> str | None:
        # srun's last words say why (the step was refused, or the node could not run it).
        if STEP_ERROR not in output:
            return None
        return output.strip().splitlines()[-1]

    def list_platform_jobs(self, prefix: str) -> dict[str, str]:
        # Live jobs of the cluster account only (--me): platform jobs all run under it.
        result = self._run(["squeue", "--noheader", "--me", "--array", f"--Format={QUERY_FORMAT}"])
        if result.exit_status != 0 or _error_lines(result.stderr):
            raise QueryFailed(f"squeue failed: {result.stderr.strip()[:500]}")
        return {
            job_id: listed_key(info)
            for job_id, info in parse_squeue(result.stdout).items()
            if info.name.startswith(prefix) and info.phase is not Phase.ENDED
        }

    def partitions(self) -> list[Partition]:
        result = self._run(["sinfo", "--noheader", "--format=%P|%a|%l|%D|%T"])
        if result.exit_status != 0 or _error_lines(result.stderr):
            raise QueryFailed(f"sinfo failed: {result.stderr.strip()[:500]}")
        return parse_sinfo(result.stdout)


ADAPTER = SlurmAdapter
