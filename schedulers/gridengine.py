"""Grid Engine (Son of Grid Engine 8.1, as Debian ships it): qsub, qstat -xml, qacct, qdel,
qrsh -inherit and qconf, parsed strictly (XML with the standard library).

Written against the real cell scripts/testcluster.sh runs. Finished jobs leave ``qstat`` at
once; their end comes from ``qacct`` (accounting, on by default) or, while accounting has not
caught up, from the zombie list (``qstat -s z``: the job ended, its exit code is not written yet).

Two things differ from Slurm and shape this module:
- an execution host keeps each job's script in a spool every local user can read
  (``job_scripts/ID``, mode 755), so the job's environment (the agent's key) never goes into the
  script: it waits in a file of the account's own (0600, in a 0700 directory of its home), which
  the job reads and removes when it starts;
- only a job in a parallel environment whose ``control_slaves`` is TRUE accepts tasks from
  ``qrsh -inherit``, the one way into a running job that keeps its identity; every job goes
  into ``PARALLEL_ENVIRONMENT`` unless its directives name another. ``qrsh -inherit`` gives the
  task no terminal, so a terminal's PTY is made on the node (``script``), at its default size.
"""

from __future__ import annotations

import logging
import re
import shlex
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import datetime

from schedulers.base import (
    ENVIRONMENT_DIR,
    JOBS_FOLDER,
    SAFE_VALUE,
    CommandResult,
    FieldSyntax,
    JobInfo,
    JobSpec,
    Partition,
    Phase,
    Prepare,
    QueryFailed,
    QueryResult,
    SchedulerAdapter,
    SchedulerError,
    SubmitLoop,
    clock_time,
    environment_file,
    reads_environment,
    shell_answer,
    shell_part,
    shell_shared,
    submit_command,
    submit_program,
)

log = logging.getLogger(__name__)

PARALLEL_ENVIRONMENT = "smp"
JOB_ID = re.compile(r"^[0-9]+$")
# qstat prints array tasks as job_list entries with <tasks>; ours are plain jobs.
STATE_LETTERS = re.compile(r"^[A-Za-z]+$")
# Job names qsub -N takes (sge_types(1): no "\n\t\r/:@\\*?" and not starting with a digit).
NAME_ARGUMENT = re.compile(r"^[A-Za-z_.-][A-Za-z0-9_.-]*$")
# sge_types(1) time_specifier: [[hours:]minutes:]seconds, each part any number of digits.
WALLTIME = re.compile(r"^(?:(?:([0-9]+):)?([0-9]+):)?([0-9]+)$")
WALLTIME_PATTERN = r"[0-9]+:[0-5][0-9]:[0-5][0-9]|[0-9]+"

# Options users may set in raw directives, by full name; resources of -l by name, one per line.
# Never: the name (it carries the worker id), output and error, the queue (the environment's),
# the shell, arrays (-t), binary or blocking submissions (-b, -sync), exported variables (-v,
# -V), working directories (-cwd, -wd), holds and reruns of its own (-h, -r).
ALLOWED_OPTIONS = frozenset(
    ["-A", "-P", "-p", "-m", "-M", "-a", "-R", "-pe", "-ckpt", "-js"]
    + [
        f"-l {resource}"
        for resource in (
            "h_rt s_rt h_cpu s_cpu h_vmem s_vmem h_rss s_rss h_data s_data h_stack s_stack "
            "h_fsize s_fsize mem_free virtual_free arch gpu exclusive"
        ).split()
    ]
)
# "-pe NAME SLOTS" takes two words; every other allowed option one value at most.
OPTION = re.compile(r"(-[A-Za-z_]+)(?: ([A-Za-z0-9_.:=@%+/\-\[\]]+))?(?: ([0-9]+(?:-[0-9]*)?))?")
RESOURCE = re.compile(r"([a-z_]+)=[A-Za-z0-9_.:@%+/\-\[\]]+")

# How a job's state letters read (qstat(1) "state"): the first match wins.
DELETING = "d"
STATE_WORDS: tuple[tuple[str, str, Phase], ...] = (
    ("z", "FINISHED", Phase.ENDED),  # listed with -s z only: ended, its accounting may lag
    ("E", "ERROR", Phase.QUEUED),  # Eqw: refused to start; stays until an operator clears it
    ("h", "HELD", Phase.QUEUED),
    ("s", "SUSPENDED", Phase.QUEUED),
    ("S", "SUSPENDED", Phase.QUEUED),
    ("T", "SUSPENDED", Phase.QUEUED),  # suspended by a queue's threshold
    ("t", "TRANSFERRING", Phase.RUNNING),
    ("r", "RUNNING", Phase.RUNNING),
    ("w", "PENDING", Phase.QUEUED),
    ("q", "PENDING", Phase.QUEUED),
)
# Accounting's "failed" codes (sge_status.h) this module names; any other non-zero is a failure.
FAILED_BEFORE_START = range(1, 27)  # 1-26: the shepherd could not set the job up
LIMIT_ENFORCED = 37  # "qmaster enforced h_rt, h_cpu, or h_vmem limit"
ACCOUNTING_UNREADABLE = ("can't open", "error reading", "No such file")
NOT_IN_ACCOUNTING = re.compile(r"^error: job id \S+ not found$")

# Several jobs per command (base.SubmitLoop): on stdin each job is a line "NAME ENVSIZE SIZE
# OPTION..." and then its environment's ENVSIZE bytes and its script's SIZE bytes. The loop writes
# the environment to the job's file and gives qsub the script on stdin and the OPTIONs (each a
# word of submit_options) as its arguments; a job whose record came short is never submitted.
# The options are split on whitespace, never expanded (`set -f`: no globbing of their "[...]").
SUBMIT_MARKER = "@@activate-qsub-exit"
SUBMIT_LOOP = (
    f'export LC_ALL=C; set -f; umask 077; dir="{ENVIRONMENT_DIR}"; shared=; '
    "while read -r name envsize size options; do "
    + shell_shared("envsize")
    + shell_part("environment", "envsize")
    + shell_part("script", "size")
    + 'script="$script$shared"; '
    + 'if mkdir -p "$dir" && printf \'%s\' "$environment" > "$dir/$name.env"; then '
    "printf '%s' \"$script\" | qsub $options 2>&1; "
    'else echo "the job environment of $name could not be written"; false; fi; '
    + shell_answer(SUBMIT_MARKER)
    + "done"
)
SUBMIT_PROGRAM = submit_program(
    SUBMIT_MARKER,
    f"""
os.umask(0o077)
directory = os.environ.get("HOME", "") + {JOBS_FOLDER!r}
for words, (environment, script) in records([1, 2]):
    try:
        os.makedirs(directory, exist_ok=True)
        path = "%s/%s.env" % (directory, words[0])
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(environment)
    except OSError as exc:
        answer("the job environment of %s could not be written: %s" % (words[0], exc), 1)
        continue
    answer(*run(["qsub"] + words[3:], script))
""",
)
SUBMIT_COMMAND = submit_command(SUBMIT_PROGRAM, SUBMIT_LOOP)
SUBMIT = SubmitLoop("qsub", SUBMIT_MARKER, SUBMIT_COMMAND, re.compile(r"([0-9]+)"), last_size_at=2)
# Jobs per command and commands at once, as SlurmAdapter's (channels of one kept connection):
# each qsub mostly waits on the qmaster, so several loops overlap those waits. On the test cell
# 100 waiting jobs took 4.3-4.6 s at 8 at once, 6.1-6.2 s at 4, 18.6-20.8 s one qsub a command.
SUBMIT_CHUNK = 64
SUBMIT_PARALLEL = 8
OWN_JOBS = 'exec qstat -xml -u "$(id -un)"'
OWN_ZOMBIES = 'exec qstat -xml -s z -u "$(id -un)"'
# What qrsh prints when it cannot start a task (the program's own errors never say this).
TASK_FAILURE = re.compile(
    r"^error: executing task of job [0-9]+ failed|^error: commlib error|unable to contact qmaster"
)


def parse_submit_loop(stdout: str, adapter: SchedulerAdapter) -> list[str | SchedulerError]:
    """One outcome per marker line of SUBMIT_COMMAND's output, in order."""
    return SUBMIT.outcomes(stdout, adapter)


def walltime_seconds(value: str) -> int | None:
    match = WALLTIME.fullmatch(value.strip())
    if match is None:
        return None
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def node_of(queue_instance: str) -> str:
    """ "all.q@node7" -> "node7"."""
    return queue_instance.rpartition("@")[2] if "@" in queue_instance else ""


def state_of(letters: str) -> tuple[str, Phase]:
    """The state word and phase of qstat's letters (qw, hqw, r, dr, Eqw, Rr, ...)."""
    if DELETING in letters:
        # qdel is under way: still on its node (dr) or still queued (dqw).
        return "DELETING", Phase.RUNNING if "r" in letters or "t" in letters else Phase.QUEUED
    for letter, word, phase in STATE_WORDS:
        if letter in letters:
            return word, phase
    log.warning("unknown Grid Engine job state %r; treating the job as queued", letters)
    return letters.upper(), Phase.QUEUED


def _xml(result: CommandResult, what: str) -> ET.Element:
    try:
        # The cluster's own output; expat (2.4+) caps entity expansion and ElementTree never
        # fetches an external entity.
        return ET.fromstring(result.stdout)  # noqa: S314
    except ET.ParseError as exc:
        raise QueryFailed(f"{what} printed XML that does not parse: {exc}") from None


def parse_qstat(stdout: str) -> dict[str, JobInfo]:
    """Jobs of ``qstat -xml`` (running ones under queue_info, waiting ones under job_info)."""
    root = _xml(CommandResult(0, stdout, ""), "qstat")
    jobs: dict[str, JobInfo] = {}
    for entry in root.iter("job_list"):
        job_id = (entry.findtext("JB_job_number") or "").strip()
        letters = (entry.findtext("state") or "").strip()
        if not JOB_ID.fullmatch(job_id) or not STATE_LETTERS.fullmatch(letters):
            raise QueryFailed(f"unexpected qstat entry: job {job_id!r} state {letters!r}")
        state, phase = state_of(letters)
        node = node_of((entry.findtext("queue_name") or "").strip())
        jobs[job_id] = JobInfo(
            job_id=job_id,
            name=(entry.findtext("JB_name") or "").strip(),
            phase=phase if node or phase is Phase.QUEUED else Phase.QUEUED,
            state=state,
            node=node,
            reason=f"Grid Engine state {letters}" if state == "ERROR" else "",
        )
    return jobs


def parse_qacct(stdout: str, job_id: str) -> JobInfo | None:
    """The job's own record of ``qacct -j ID``.

    Each task a job started through ``qrsh -inherit`` has a record too (unless its parallel
    environment sums them up). The job's own was submitted first (a task's "qsub_time" is its
    start) and ended last: its tasks end when it does at the latest.
    """
    records = [_record(block) for block in re.split(r"^=+$", stdout, flags=re.MULTILINE)]
    records = [r for r in records if r.get("jobnumber") == job_id]
    if not records:
        return None
    record = min(reversed(records), key=lambda r: (_when(r, "qsub_time"), -_when(r, "end_time")))
    failed_match = re.match(r"^([0-9]+)", record.get("failed", ""))
    status_match = re.match(r"^([0-9]+)", record.get("exit_status", ""))
    if failed_match is None or status_match is None:
        raise QueryFailed(f"unexpected qacct record of {job_id}: {record!r:.300}")
    failed_code, status = int(failed_match.group(1)), int(status_match.group(1))
    limit = walltime_seconds(_requested(record.get("category", ""), "h_rt") or "")
    ran = re.match(r"^([0-9.]+)", record.get("ru_wallclock", ""))
    if failed_code in FAILED_BEFORE_START:
        state, is_failure = "FAILED", True
    elif failed_code == LIMIT_ENFORCED:
        # h_rt, h_cpu or h_vmem: the wall time when the job ran for all of its h_rt.
        reached = limit is not None and ran is not None and float(ran.group(1)) >= limit
        state, is_failure = ("TIMEOUT", False) if reached else ("LIMIT_EXCEEDED", True)
    elif status == 0 and failed_code == 0:
        state, is_failure = "COMPLETED", False
    elif status > 128:
        # Ended by a signal: qdel's, or an operator's.
        state, is_failure = "KILLED", False
    else:
        state, is_failure = "FAILED", True
    return JobInfo(
        job_id=job_id,
        name=record.get("jobname", ""),
        phase=Phase.ENDED,
        state=state,
        node=record.get("hostname", ""),
        exit_code=str(status),
        reason=record.get("failed", "") if failed_code else "",
        failed=is_failure,
    )


def _record(block: str) -> dict[str, str]:
    pairs = (line.strip().partition(" ") for line in block.splitlines())
    return {key: value.strip() for key, _, value in pairs if key}


def _when(record: dict[str, str], key: str) -> float:
    try:
        moment = datetime.strptime(" ".join(record.get(key, "").split()), "%a %b %d %H:%M:%S %Y")
    except ValueError:
        return 0.0
    return moment.timestamp()


def _requested(category: str, resource: str) -> str | None:
    """A resource's value in qacct's category ("-l h_rt=60,h_vmem=1G -pe smp 1")."""
    match = re.search(rf"(?:^|[\s,]){re.escape(resource)}=([^\s,]+)", category)
    return match.group(1) if match else None


def parse_queue_summary(stdout: str) -> list[Partition]:
    """Cluster queues of ``qstat -g c -xml`` with their slot counts."""
    root = _xml(CommandResult(0, stdout, ""), "qstat -g c")
    partitions = []
    for entry in root.iter("cluster_queue_summary"):
        name = (entry.findtext("name") or "").strip()
        counts = {tag: (entry.findtext(tag) or "").strip() for tag in ("total", "available")}
        if not name or not all(value.isdigit() for value in counts.values()):
            raise QueryFailed(f"unexpected qstat -g c entry for queue {name!r}")
        partitions.append(
            Partition(
                name=name,
                nodes_total=int(counts["total"]),
                nodes_available=int(counts["available"]),
            )
        )
    return partitions


def parse_queue_limits(stdout: str) -> dict[str, str]:
    """Queue -> h_rt of ``qconf -sq Q1,Q2`` ("" when unlimited)."""
    limits: dict[str, str] = {}
    name = ""
    for line in stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "qname":
            name = value.strip()
        elif key == "h_rt" and name:
            limit = value.strip()
            limits[name] = "" if limit.upper() == "INFINITY" else limit
    return limits


class GridEngineAdapter(SchedulerAdapter):
    name = "gridengine"
    label = "Grid Engine"
    directive_prefix = "#$"
    job_id_variable = "JOB_ID"
    unavailable_markers = (
        "unable to contact qmaster",
        "commlib error",
        "can't unpack gdi request",
        "failed receiving gdi request",
        "timed out",
    )
    allowed_options = ALLOWED_OPTIONS
    # Grid Engine places slots, not nodes, and has no QoS: neither is a field here.
    field_syntax = {
        "walltime": FieldSyntax("-l h_rt={value}", WALLTIME_PATTERN),
        "account": FieldSyntax("-A {value}"),
        "directives": FieldSyntax(example="-l h_vmem=4G"),
    }

    @classmethod
    def option_of(cls, directive: str) -> str | None:
        match = OPTION.fullmatch(directive)
        if match is None:
            return None
        flag, value, slots = match.groups()
        if flag == "-pe":
            return flag if value and slots and SAFE_VALUE.fullmatch(value) else None
        if slots is not None:
            return None
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
        directives = [f"-N {spec.name}", "-S /bin/bash", "-j y", "-o /dev/null"]
        if spec.partition:
            directives.append(f"-q {spec.partition}")
        if not any(d.startswith("-pe ") for d in spec.directives):
            directives.append(f"-pe {PARALLEL_ENVIRONMENT} 1")
        return directives

    def submit_options(self, spec: JobSpec) -> list[str]:
        options = ["-terse", "-N", spec.name, "-S", "/bin/bash", "-j", "y", "-o", "/dev/null"]
        if spec.partition:
            options += ["-q", spec.partition]
        return options

    def render_script(self, spec: JobSpec) -> str:
        # The account's private file the job's environment waits in, named after the job.
        script = super().render_script(replace(spec, environment={}))
        return reads_environment(script, f'"{ENVIRONMENT_DIR}/{spec.name}.env"')

    def submit(self, spec: JobSpec) -> str:
        [outcome] = self.submit_many([spec])
        if isinstance(outcome, SchedulerError):
            raise outcome
        return outcome

    def submit_many(
        self, specs: list[JobSpec], *, prepare: Prepare | None = None
    ) -> list[str | SchedulerError]:
        return self.submit_in_loops(
            specs,
            SUBMIT,
            record=self._record,
            chunk=SUBMIT_CHUNK,
            parallel=SUBMIT_PARALLEL,
            prepare=prepare,
        )

    def _record(self, spec: JobSpec) -> tuple[list[str], str]:
        if not NAME_ARGUMENT.fullmatch(spec.name):
            # It names the environment's file too: no "/" may take that elsewhere.
            raise SchedulerError(f"job name {spec.name!r} is not one Grid Engine takes")
        # The environment too: render_script leaves it out of the script, and so of its checks.
        self.check_spec(spec)
        script = self.render_script(spec)
        environment = environment_file(spec)
        sizes = [str(len(environment.encode())), str(len(script.encode()))]
        return [spec.name, *sizes, *self.submit_options(spec)], environment + script

    def _own_jobs(self) -> dict[str, JobInfo]:
        result = self.runner.run(["sh", "-c", OWN_JOBS])
        if result.exit_status != 0 or result.stderr.strip():
            raise QueryFailed(f"qstat failed: {result.stderr.strip()[:500]}")
        return parse_qstat(result.stdout)

    def query(self, job_ids: list[str]) -> QueryResult:
        bad = [job_id for job_id in job_ids if not JOB_ID.fullmatch(job_id)]
        if bad:
            raise ValueError(f"not Grid Engine job ids: {bad[:5]!r}")
        if not job_ids:
            return QueryResult(jobs={})
        # One command however many jobs: the account's own list, finished jobs left out.
        wanted = set(job_ids)
        return QueryResult(jobs={k: v for k, v in self._own_jobs().items() if k in wanted})

    def final_state(self, job_id: str) -> JobInfo | None:
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a Grid Engine job id: {job_id!r}")
        accounting = self.runner.run(["qacct", "-j", job_id])
        if accounting.exit_status == 0:
            info = parse_qacct(accounting.stdout, job_id)
            if info is not None:
                return info
        problem = accounting.stderr.strip()
        if problem and not NOT_IN_ACCOUNTING.fullmatch(problem):
            if not any(marker in problem for marker in ACCOUNTING_UNREADABLE):
                raise QueryFailed(f"qacct failed: {problem[:500]}")
        zombies = self.runner.run(["sh", "-c", OWN_ZOMBIES])
        if zombies.exit_status != 0 or zombies.stderr.strip():
            raise QueryFailed(f"qstat -s z failed: {zombies.stderr.strip()[:500]}")
        if job_id not in parse_qstat(zombies.stdout):
            return None
        if not problem or NOT_IN_ACCOUNTING.fullmatch(problem):
            # Ended, and accounting writes its record within its flush time: ask again later.
            raise QueryFailed(f"job {job_id} ended; its accounting record is not written yet")
        # No accounting here: Grid Engine knows the job ended, not how.
        return JobInfo(job_id, "", Phase.ENDED, "FINISHED", reason="no accounting on this cell")

    def _names(self, names: list[str]) -> None:
        bad = [name for name in names if not NAME_ARGUMENT.fullmatch(name)]
        if bad:
            raise ValueError(f"not Grid Engine job names: {bad[:5]!r}")

    def find_job(self, name: str) -> str | None:
        return self.find_jobs([name]).get(name)

    def find_jobs(self, names: list[str]) -> dict[str, str]:
        self._names(names)
        wanted = set(names)
        found: dict[str, str] = {}
        # The account's own jobs only: anyone on the cluster can name a job like ours.
        for job_id, info in sorted(self._own_jobs().items(), key=lambda item: int(item[0])):
            if info.name in wanted:
                if info.name in found:
                    log.warning("more than one live job is named %s", info.name)
                found[info.name] = job_id
        return found

    def list_platform_jobs(self, prefix: str) -> dict[str, str]:
        return {
            job_id: info.name
            for job_id, info in self._own_jobs().items()
            if info.name.startswith(prefix)
        }

    def cancel(self, job_id: str) -> None:
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a Grid Engine job id: {job_id!r}")
        result = self.runner.run(["qdel", job_id])
        if result.exit_status == 0:
            return
        # qdel says why on stdout.
        said = (result.stdout + "\n" + result.stderr).strip()
        if f'job "{job_id}" does not exist' in said:
            return
        raise self.refusal("qdel", CommandResult(result.exit_status, "", said))

    def _task(self, job_id: str) -> list[str]:
        """The login host's argv that starts a task inside the running job, on its node."""
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a Grid Engine job id: {job_id!r}")
        info = self.query([job_id]).get(job_id)
        if info is None or info.phase is not Phase.RUNNING or not info.node:
            raise SchedulerError(f"job {job_id} is not running on a node")
        if not SAFE_VALUE.fullmatch(info.node):
            raise ValueError(f"not a node name: {info.node!r}")
        # qrsh -inherit finds the job in JOB_ID; the task is accounted to the job, in its limits.
        return ["env", f"JOB_ID={job_id}", "SGE_TASK_ID=undefined", "qrsh", "-inherit", info.node]

    def run_in_job(
        self,
        job_id: str,
        argv: list[str],
        *,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> CommandResult:
        # qrsh joins its arguments for the node's shell, as ssh does: argv goes as one word.
        return self.runner.run(
            [*self._task(job_id), shlex.join(argv)], timeout=timeout, output_limit=output_limit
        )

    def interactive_command(self, job_id: str, argv: list[str], *, pty: bool) -> str:
        task = self._task(job_id)
        program = shlex.join(argv) if argv else 'exec "${SHELL:-/bin/sh}" -l'
        if pty:
            program = f"exec script -qfec {shlex.quote(program)} /dev/null"
        return shlex.join([*task, program])

    @classmethod
    def interactive_failure(cls, output: str) -> str | None:
        failures = [line for line in output.splitlines() if TASK_FAILURE.search(line.strip())]
        return failures[-1].strip() if failures else None

    def partitions(self) -> list[Partition]:
        summary = self.runner.run(["qstat", "-g", "c", "-xml"])
        if summary.exit_status != 0 or summary.stderr.strip():
            raise QueryFailed(f"qstat -g c failed: {summary.stderr.strip()[:500]}")
        queues = parse_queue_summary(summary.stdout)
        if not queues:
            return []
        names = ",".join(queue.name for queue in queues)
        limits_result = self.runner.run(["qconf", "-sq", names])
        if limits_result.exit_status != 0:
            raise QueryFailed(f"qconf -sq failed: {limits_result.stderr.strip()[:500]}")
        limits = parse_queue_limits(limits_result.stdout)
        # Grid Engine has no default queue; all.q, the one its installer makes, serves as one.
        default = "all.q" if any(queue.name == "all.q" for queue in queues) else ""
        return [
            replace(queue, max_time=limits.get(queue.name, ""), is_default=queue.name == default)
            for queue in queues
        ]


ADAPTER = GridEngineAdapter
