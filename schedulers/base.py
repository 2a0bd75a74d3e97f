"""The one interface every scheduler adapter implements, and the values they exchange."""

from __future__ import annotations

import enum
import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from core.transport.commands import CommandResult


class SchedulerError(Exception):
    """The scheduler answered, and refused (bad partition, invalid option, ...)."""


class SchedulerUnavailable(SchedulerError):
    """The scheduler did not answer (controller down, timed out): nothing was refused, and
    whether anything happened is unknown. Worth retrying; never a reason to fail a worker."""


class QueryFailed(Exception):
    """A status query did not give a trustworthy answer; nothing may change because of it."""


class CommandRunner(Protocol):
    """Runs one command (argv, quoted by the runner) on the cluster's login host."""

    def run(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> CommandResult: ...


class Phase(enum.Enum):
    QUEUED = "queued"  # waiting for resources (also held, requeued, suspended)
    RUNNING = "running"  # on a node
    ENDED = "ended"  # finished; state and exit code are final


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    name: str
    phase: Phase
    state: str  # the scheduler's own word, e.g. RUNNING, TIMEOUT
    node: str = ""
    exit_code: str = ""
    reason: str = ""
    # For ENDED jobs: whether the end is a failure (shown as error) or a normal stop.
    failed: bool = False


@dataclass(frozen=True)
class QueryResult:
    """Answer of a successful query: a job missing from ``jobs`` is "not listed"."""

    jobs: dict[str, JobInfo]

    def get(self, job_id: str) -> JobInfo | None:
        return self.jobs.get(job_id)


@dataclass(frozen=True)
class Partition:
    name: str
    nodes_total: int
    nodes_available: int
    is_default: bool = False
    max_time: str = ""


@dataclass(frozen=True)
class FieldTemplate:
    """A settable field an auto-detected environment offers, in this scheduler's terms."""

    name: str
    label: str
    directive: str = ""
    default: str = ""
    pattern: str = ""
    required: bool = False
    kind: str = "value"
    example: str = ""


@dataclass(frozen=True)
class FieldSyntax:
    """How one scheduler spells a standard field; unset parts keep the standard's."""

    directive: str = ""
    pattern: str = ""
    example: str = ""


NAME_PATTERN = r"[A-Za-z0-9_.-]+"
# The wall times an auto-detected environment proposes, in seconds; each adapter writes them.
DEFAULT_WALLTIME = 3600
EXAMPLE_WALLTIME = 4 * 3600
# The fields an auto-detected environment offers, whatever the scheduler; each adapter says
# which it supports and how (``field_syntax``).
STANDARD_FIELDS = (
    # Default and example come from the adapter (format_walltime).
    FieldTemplate(name="walltime", label="Wall Time"),
    FieldTemplate(
        name="numNodes", label="Nodes", default="1", pattern=r"[1-9][0-9]{0,4}", example="2"
    ),
    FieldTemplate(name="account", label="Account", pattern=NAME_PATTERN, example="proj123"),
    FieldTemplate(name="qos", label="QoS", pattern=NAME_PATTERN, example="normal"),
    FieldTemplate(name="directives", label="Scheduler directives", kind="directives"),
)


def clock_time(seconds: int) -> str:
    """``HH:MM:SS``, with as many hour digits as it takes: the wall-time form most schedulers
    read."""
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


@dataclass(frozen=True)
class JobSpec:
    name: str
    partition: str
    directives: list[str]  # already validated options, e.g. ["--time=04:00:00"]
    environment: dict[str, str] = field(default_factory=dict)
    command: str = ""  # shell text run by the job; the job ends when it ends
    # Set by an adapter that sends the job as task ``index`` of a job array named ``array``
    # (its tasks share that name: the job is found by task_key(array, index), not by ``name``).
    array: str = ""
    index: int = 0

    @property
    def key(self) -> str:
        """What a listing of the scheduler's jobs names this job by (``list_platform_jobs``)."""
        return task_key(self.array, self.index) if self.array else self.name


def task_key(array: str, index: int | str) -> str:
    """How a task of a job array is named in lookups and listings: its array's name and its
    index, "NAME[INDEX]" (a job's own name never ends so: job names are validated words)."""
    return f"{array}[{index}]"


def environment_file(spec: JobSpec) -> str:
    """A job's environment as the lines of a file its script reads with ``set -a; .``: kept
    out of the script where the script is shared or shown to others."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(spec.environment.items()))


# The account's private folder a job's environment file waits in (``environment_file``).
JOBS_FOLDER = "/.activate/jobs"
ENVIRONMENT_DIR = "$HOME" + JOBS_FOLDER


def reads_environment(script: str, path: str) -> str:
    """``script`` (a render without environment) reading and removing its environment file
    ``path`` (shell words, e.g. quoted with variables) before its first command."""
    lines = script.split("\n")
    header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    lines.insert(header, f"set -a; . {path} || exit 1; set +a; rm -f {path}")
    return "\n".join(lines)


# Values that may go into a directive: no whitespace, no shell or line metacharacters.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.:,=@%+/\-\[\]]+$")
ENVIRONMENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Where a job script hands the node agent its job id, whatever the scheduler calls it.
JOB_ID_VARIABLE = "ACTIVATE_JOB_ID"
JOB_VARIABLE_NAME = "ACTIVATE_JOB_VARIABLE"


# Batched submission: many jobs in one command on the login host. On stdin each job is a header
# line of words (no whitespace inside one: its name, its parts' sizes, what else its scheduler
# needs) and then its parts' bytes (the script, ...), which reach the submit command without
# passing the shell's parser; each submit command's output is closed by a marker line with its
# exit status. A part that came short is never used: the loop stops there, and the jobs it did
# not answer stay unknown (SchedulerUnavailable: the caller finds them by name before submitting
# again). A part is read with `head -c` in blocks (the shell's `read` takes a pipe a byte at a
# time: 5 ms per 12 KB script). A header "#shared SIZE" (no job's name starts with "#") gives
# bytes every later job's last part ends with, sent once a command instead of once a job: the
# platform's scripts all end with the same agent, most of their bytes, which the connection
# would otherwise encrypt and the login host's sshd decrypt once per job.
#
# The loop runs in the login host's Python where it has one: one process per command instead of
# a subshell, a `head` and a pipeline per script, which took a quarter of a Slurm batch's time
# (docs/benchmarks.md). Same input, same output. Only `os`, `sys` (already loaded at start-up;
# `subprocess` alone takes 18 ms to import) and `select`, and what any Python 3 has. It travels
# as one line with no "!" (exec of its repr): csh refuses a line break inside quotes and expands
# "!". The submit command starts by posix_spawn (sbatch: 3.4 ms a job in a serial loop here, 5.0
# by fork: a fork copies the interpreter), by fork where Python is older than 3.8.
#
# Once the platform has left (its command timed out: the channel, and with it the reader of the
# loop's stdout, closed) the loop submits nothing more: it starts no further job and ends the
# submit command under way, which would otherwise make its job after the platform's retry had
# looked the name up (a duplicate: sbatch waits and retries while the controller refuses new
# jobs, past any command timeout). The shell loop stops at its next answer (SIGPIPE).
SUBMIT_HELPERS = """
import os, select, sys
env = dict(os.environ, LC_ALL="C")
source = sys.stdin.buffer


def start(argv, data_in, answer_out):
    if hasattr(os, "posix_spawnp"):
        dup = os.POSIX_SPAWN_DUP2
        actions = [(dup, data_in, 0), (dup, answer_out, 1), (dup, answer_out, 2)]
        return os.posix_spawnp(argv[0], argv, env, file_actions=actions)
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(data_in, 0)
            os.dup2(answer_out, 1)
            os.dup2(answer_out, 2)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(2, ("%s: %s" % (argv[0], exc)).encode())
        finally:
            os._exit(127)
    return pid


def run(argv, data):
    watch = select.poll()
    watch.register(1, 0)
    if watch.poll(0):
        sys.exit(3)
    data_in, data_out = os.pipe()
    answer_in, answer_out = os.pipe()
    try:
        pid = start(argv, data_in, answer_out)
    except OSError as exc:
        for fd in (data_in, data_out, answer_in, answer_out):
            os.close(fd)
        return "%s: %s" % (argv[0], exc), 127
    os.close(data_in)
    os.close(answer_out)
    try:
        while data:
            data = data[os.write(data_out, data) :]
    except OSError:
        pass
    os.close(data_out)
    watch.register(answer_in, select.POLLIN)
    chunks = []
    while True:
        ready = dict(watch.poll())
        if 1 in ready:
            os.kill(pid, 15)
            os.waitpid(pid, 0)
            sys.exit(3)
        chunk = os.read(answer_in, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(answer_in)
    status = os.waitpid(pid, 0)[1]
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    return b"".join(chunks).decode(errors="replace"), code


def answer(output, code):
    sys.stdout.write("%s\\n%s %d\\n" % (output, MARKER, code))
    sys.stdout.flush()


def records(sizes_at):
    shared = b""
    while True:
        header = source.readline()
        if not header:
            return
        words = header.decode(errors="replace").split()
        if words[:1] == [SHARED]:
            size = words[1] if len(words) > 1 else ""
            shared = source.read(int(size)) if size.isdigit() else b""
            if not size.isdigit() or len(shared) < int(size):
                sys.stderr.write("shared part cut short\\n")
                return
            continue
        sizes = [words[i] if i < len(words) else "" for i in sizes_at]
        if not all(size.isdigit() for size in sizes):
            sys.stderr.write("bad header: %r\\n" % header[:200])
            return
        parts = [source.read(int(size)) for size in sizes]
        if any(len(part) < int(size) for part, size in zip(parts, sizes)):
            sys.stderr.write("script of %s cut short\\n" % words[0])
            return
        parts[-1] += shared
        yield words, parts
"""
SHARED = "#shared"
# A command's jobs share their end once it is this long (shorter, it is not worth a record).
SHARED_AT_LEAST = 1024
HEADER_WORD = re.compile(r"\S+")


def submit_program(marker: str, main: str) -> str:
    """The Python loop: SUBMIT_HELPERS, then ``main``, which submits each of ``records(SIZES_AT)``
    (a header's words and its parts; SIZES_AT: where in a header the parts' sizes are) with
    ``answer(*run(argv, part))``."""
    return f"MARKER = {marker!r}\nSHARED = {SHARED!r}\n{SUBMIT_HELPERS}{main}"


def shell_part(variable: str, size: str) -> str:
    """The shell loop's reading of one part of ``$size`` bytes into ``$variable``; a part that
    came short stops the loop."""
    return (
        f'{variable}=$(head -c "${size}"; printf x); {variable}=${{{variable}%x}}; '
        f'[ "${{#{variable}}}" = "${size}" ] || '
        '{ echo "script of $name cut short" >&2; break; }; '
    )


def shell_shared(size: str) -> str:
    """The shell loop's reading of a "#shared" record (its size in ``$size``) into $shared,
    which the loop appends to each later job's last part; put first in the loop's body, with
    $shared empty before the loop."""
    return f'if [ "$name" = "{SHARED}" ]; then ' + shell_part("shared", size) + "continue; fi; "


def shell_answer(marker: str) -> str:
    """The shell loop's marker line after a submit command, with its exit status."""
    return f"printf '\\n{marker} %s\\n' \"$?\"; "


def submit_command(program: str, shell_loop: str) -> list[str]:
    """The login host's command: ``program`` in Python where it has python3, else the shell's
    ``shell_loop`` (nodes need Python for the agent; a login host may not have it)."""
    return [
        "sh",
        "-c",
        'if command -v python3 >/dev/null 2>&1; then exec python3 -I -S -c "$1"; fi; eval "$2"',
        "sh",
        f"exec({program!r})",
        shell_loop,
    ]


@dataclass(frozen=True)
class SubmitLoop:
    """One scheduler's batched submission: its command, and how its answers read."""

    submitter: str  # the command the loop runs for each job, as its errors name it
    marker: str
    command: list[str]
    # The submit command's last line of output when it made the job; group 1 is the id.
    made: re.Pattern[str]
    # Where in a job's header the size of its last part is (the part "#shared" bytes end).
    last_size_at: int

    def outcomes(self, stdout: str, adapter: SchedulerAdapter) -> list[str | SchedulerError]:
        """One outcome per marker line of the loop's output, in order."""
        outcomes: list[str | SchedulerError] = []
        output: list[str] = []
        for line in stdout.splitlines():
            if not line.startswith(self.marker + " "):
                if line.strip():
                    output.append(line.strip())
                continue
            status = line.removeprefix(self.marker + " ").strip()
            if status != "0":
                message = "; ".join(output)[:1000]
                failed = CommandResult(int(status) if status.isdigit() else 1, "", message)
                outcomes.append(adapter.refusal(self.submitter, failed))
            else:
                match = self.made.fullmatch(output[-1]) if output else None
                outcomes.append(
                    match.group(1)
                    if match
                    else SchedulerUnavailable(
                        f"unexpected {self.submitter} output: {' '.join(output)[:200]!r}"
                    )
                )
            output = []
        return outcomes


def _with_shared_end(records: list[tuple[list[str], str]], last_size_at: int) -> list[str]:
    """A command's records (header words, data) as sent: the end every job's data has in
    common, when long enough and inside each one's last part, in one "#shared" record first."""
    end = _common_end([text for _, text in records]) if len(records) > 1 else ""
    size = len(end.encode())
    if size < SHARED_AT_LEAST or any(size > int(words[last_size_at]) for words, _ in records):
        return [" ".join(words) + "\n" + text for words, text in records]
    sent = [f"{SHARED} {size}\n{end}"]
    for words, text in records:
        own = [*words]
        own[last_size_at] = str(int(words[last_size_at]) - size)
        sent.append(" ".join(own) + "\n" + text[: len(text) - len(end)])
    return sent


def _common_end(texts: list[str]) -> str:
    """The longest end all ``texts`` have in common."""
    shortest = min(texts, key=len)
    low, high = 0, len(shortest)
    while low < high:  # ending alike is the same for every shorter end: halve the range
        middle = (low + high + 1) // 2
        if all(text.endswith(shortest[len(shortest) - middle :]) for text in texts):
            low = middle
        else:
            high = middle - 1
    return shortest[len(shortest) - low :]


# Gives the specs to send in place of a command's specs (submit_many's ``prepare``).
Prepare = Callable[[list[JobSpec]], list[JobSpec]]
Outcomes = list[str | SchedulerError]
T = TypeVar("T")


def equal_shares(items: list[T], *, most: int, parallel: int) -> list[list[T]]:
    """``items`` in order, dealt in equal shares of at most ``most``: as many as run at once (or
    a multiple of it), so that no command is left running alone at the end."""
    if not items:
        return []
    rounds = -(-len(items) // (parallel * most))
    count = min(len(items), parallel * rounds)
    return [items[i * len(items) // count : (i + 1) * len(items) // count] for i in range(count)]


def send_at_once(
    shares: list[list[JobSpec]],
    send: Callable[[list[JobSpec]], Outcomes],
    *,
    parallel: int,
    prepare: Prepare | None,
) -> Outcomes:
    """Each share's outcomes, in order: up to ``parallel`` sent at once, each prepared in this
    thread just before it is sent (the first command starts once its own jobs are prepared)."""

    def ready(share: list[JobSpec]) -> list[JobSpec]:
        return share if prepare is None else prepare(share)

    if len(shares) == 1:
        return send(ready(shares[0]))
    with ThreadPoolExecutor(min(parallel, len(shares))) as pool:
        sending = [pool.submit(send, ready(share)) for share in shares]
        # The first share's SSHError (every outcome then unknown) once all have ended.
        return [outcome for done in sending for outcome in done.result()]


class SchedulerAdapter(ABC):
    # What a cluster's ``scheduler`` stores (the module's own name), and what people read.
    name: str
    label: str
    directive_prefix: str
    field_syntax: dict[str, FieldSyntax]
    # Options a user may set in raw directives, by full name (``option_of`` spells them). An
    # allowlist: schedulers accept any unique prefix of a long option, so no denylist holds.
    allowed_options: frozenset[str]
    # The environment variable in which a running job finds its own id; "" when the adapter
    # puts the id in JOB_ID_VARIABLE itself.
    job_id_variable: str

    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner

    def default_fields(self) -> list[FieldTemplate]:
        """Fields of an auto-detected environment, in this scheduler's terms."""
        fields = []
        for template in STANDARD_FIELDS:
            syntax = self.field_syntax.get(template.name)
            if syntax is None:
                continue
            if template.name == "walltime":
                template = replace(
                    template,
                    default=self.format_walltime(DEFAULT_WALLTIME),
                    example=self.format_walltime(EXAMPLE_WALLTIME),
                )
            fields.append(
                replace(
                    template,
                    directive=syntax.directive,
                    pattern=syntax.pattern or template.pattern,
                    example=syntax.example or template.example,
                )
            )
        return fields

    @classmethod
    @abstractmethod
    def parse_walltime(cls, value: str) -> int | None:
        """Seconds in a wall time as this scheduler's wall-time field takes it (e.g.
        ``04:00:00``); None when the value is not one."""

    @classmethod
    @abstractmethod
    def format_walltime(cls, seconds: int) -> str:
        """``seconds`` (more than zero) written as this scheduler's wall-time field takes it."""

    @classmethod
    @abstractmethod
    def option_of(cls, directive: str) -> str | None:
        """The option a directive line sets (e.g. "time" for --time=1:00), or None if the
        line is not one well-formed option with a safe value."""

    @classmethod
    def directive_problem(cls, directive: str, *, set_by_fields: Mapping[str, str]) -> str | None:
        """Why a user's raw directive is refused, or None when it may go into a job script.

        ``set_by_fields`` maps the options the environment's own fields set to their labels.
        """
        option = cls.option_of(directive)
        if option is None:
            return f"{directive!r} is not a single scheduler option with a plain value"
        if option in set_by_fields:
            return f"{directive!r} sets {option}: use the {set_by_fields[option]} field instead"
        if option not in cls.allowed_options:
            return f"{directive!r}: option {option} is not one users may set"
        return None

    # Words in a failed command's message that mean the scheduler did not answer.
    unavailable_markers: tuple[str, ...] = ()

    def refusal(self, what: str, result: CommandResult) -> SchedulerError:
        """The error a failed scheduler command means: unavailable, or a real refusal."""
        message = result.stderr.strip() or f"{what} exited {result.exit_status}"
        if any(marker in message for marker in self.unavailable_markers):
            return SchedulerUnavailable(message)
        return SchedulerError(message)

    def submit_options(self, spec: JobSpec) -> list[str]:
        """Options given on the submit command line, where they win over the script's."""
        return []

    def render_script(self, spec: JobSpec) -> str:
        self.check_spec(spec)
        lines = ["#!/bin/bash"]
        lines += [f"{self.directive_prefix} {d}" for d in self.header_directives(spec)]
        lines += [f"{self.directive_prefix} {d}" for d in spec.directives]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.environment.items())]
        if self.job_id_variable:
            lines.append(f'export {JOB_ID_VARIABLE}="${{{self.job_id_variable}:-}}"')
            # The agent counts the processes whose environment names the job as its own.
            lines.append(f"export {JOB_VARIABLE_NAME}={self.job_id_variable}")
        lines.append(spec.command)
        return "\n".join(lines) + "\n"

    def check_spec(self, spec: JobSpec) -> None:
        """Refuse (SchedulerError) a spec that could smuggle lines or options into the script.

        Parameters are validated when a worker is requested; this is the last line of defence
        for whatever reaches an adapter by another path.
        """
        if not SAFE_VALUE.fullmatch(spec.name):
            raise SchedulerError(f"job name {spec.name!r} contains characters that are not allowed")
        if spec.partition and not SAFE_VALUE.fullmatch(spec.partition):
            raise SchedulerError(f"partition {spec.partition!r} is not allowed")
        for directive in spec.directives:
            problem = self.directive_problem(directive, set_by_fields={})
            if problem:
                raise SchedulerError(f"directive refused: {problem}")
        for key, value in spec.environment.items():
            if not ENVIRONMENT_NAME.fullmatch(key):
                raise SchedulerError(f"environment variable name {key!r} is not allowed")
            if "\x00" in value:
                raise SchedulerError(f"environment variable {key} contains a NUL character")
        if "\x00" in spec.command:
            raise SchedulerError("the job command contains a NUL character")

    @abstractmethod
    def header_directives(self, spec: JobSpec) -> list[str]:
        """Directives the platform always sets (job name, partition, output)."""

    @abstractmethod
    def submit(self, spec: JobSpec) -> str:
        """Submit the job (its script sent on stdin); returns the job id. SchedulerError if
        refused."""

    def submit_many(
        self, specs: list[JobSpec], *, prepare: Prepare | None = None
    ) -> list[str | SchedulerError]:
        """Submit several jobs in as few commands as the scheduler allows.

        One outcome per spec, in order: the job id, or that job's own error (a
        SchedulerUnavailable when whether it was made is unknown). SSHError when the command
        itself failed: then every outcome is unknown. ``prepare``, if given, is called in this
        thread with the specs of each command before that command starts, and gives the specs
        it sends instead (the same jobs, in order): what must be durable before a job may exist
        is done there, a command's worth at a time, while the commands before it run. This
        fallback prepares them all, then submits one at a time.
        """
        if prepare is not None:
            specs = prepare(specs)
        outcomes: list[str | SchedulerError] = []
        for spec in specs:
            try:
                outcomes.append(self.submit(spec))
            except SchedulerError as exc:
                outcomes.append(exc)
        return outcomes

    def submit_in_loops(
        self,
        specs: list[JobSpec],
        loop: SubmitLoop,
        *,
        record: Callable[[JobSpec], tuple[list[str], str]],
        chunk: int,
        parallel: int,
        prepare: Prepare | None = None,
    ) -> list[str | SchedulerError]:
        """submit_many through a login-host ``loop``: at most ``chunk`` jobs a command, up to
        ``parallel`` commands at once, each command's specs prepared (``prepare``) just before
        it starts. ``record`` gives a job's header words and the data after them, or refuses
        the job (SchedulerError, that job's own outcome)."""
        if not specs:
            return []

        def submit_chunk(chunk_specs: list[JobSpec]) -> list[str | SchedulerError]:
            return self._submit_loop_chunk(chunk_specs, loop, record)

        shares = equal_shares(specs, most=chunk, parallel=parallel)
        return send_at_once(shares, submit_chunk, parallel=parallel, prepare=prepare)

    def _submit_loop_chunk(
        self,
        specs: list[JobSpec],
        loop: SubmitLoop,
        record: Callable[[JobSpec], tuple[list[str], str]],
    ) -> list[str | SchedulerError]:
        # A spec refused here is that job's outcome; the others still go.
        refused: dict[int, SchedulerError] = {}
        records = []
        for index, spec in enumerate(specs):
            try:
                words, data = record(spec)
                bad = [word for word in words if not HEADER_WORD.fullmatch(word)]
                if bad:
                    raise SchedulerError(f"job {spec.name!r}: {bad[0]!r} cannot go in a header")
            except SchedulerError as exc:
                refused[index] = exc
                continue
            records.append((words, data))
        sent: list[str | SchedulerError] = []
        if records:
            stdin = "".join(_with_shared_end(records, loop.last_size_at))
            result = self.runner.run(loop.command, stdin=stdin)
            sent = loop.outcomes(result.stdout, self)[: len(records)]
            # The loop stopped early (killed, cut off): those jobs may or may not exist.
            unknown = f"no answer for this job's {loop.submitter}: {result.stderr.strip()[:200]}"
            sent += [SchedulerUnavailable(unknown) for _ in range(len(records) - len(sent))]
        answers = iter(sent)
        return [refused[i] if i in refused else next(answers) for i in range(len(specs))]

    @abstractmethod
    def find_job(self, name: str) -> str | None:
        """The id of a live job with this key (JobSpec.key), if any. QueryFailed if the query
        failed."""

    def find_jobs(self, names: list[str]) -> dict[str, str]:
        """Key (JobSpec.key) -> id of the live jobs with these keys (missing: none). QueryFailed
        if a query failed. This fallback asks one key at a time."""
        found: dict[str, str] = {}
        for name in names:
            job_id = self.find_job(name)
            if job_id:
                found[name] = job_id
        return found

    @abstractmethod
    def query(self, job_ids: list[str]) -> QueryResult:
        """Status of the given jobs, in as few commands as possible. QueryFailed on any doubt."""

    @abstractmethod
    def final_state(self, job_id: str) -> JobInfo | None:
        """State and exit code of a job no longer listed as live; None if nobody remembers it."""

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Ask for the job to end. Confirmation comes from a later query not listing it."""

    @abstractmethod
    def list_platform_jobs(self, prefix: str) -> dict[str, str]:
        """Live jobs whose name starts with ``prefix``: job id -> its key (its name, or for a
        task of a job array ``task_key``, as JobSpec.key). QueryFailed on failure."""

    @abstractmethod
    def partitions(self) -> list[Partition]:
        """Partitions (queues) with node counts, for auto-detected environments."""

    @abstractmethod
    def run_in_job(
        self,
        job_id: str,
        argv: list[str],
        *,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> CommandResult:
        """Run a command on the job's node (the one the scheduler reports), inside its
        allocation where the scheduler allows. SchedulerError if the job is not running."""

    @abstractmethod
    def interactive_command(self, job_id: str, argv: list[str], *, pty: bool) -> str:
        """The login host's command line that runs argv (none: the user's login shell) on the
        job's node, inside its allocation, under a terminal of its own when ``pty``. It may ask
        the scheduler first (SchedulerError if the job is not running)."""

    @classmethod
    @abstractmethod
    def interactive_failure(cls, output: str) -> str | None:
        """Why an ``interactive_command`` did not start its program, from what the command
        printed (its client's errors, never the program's own); None if nothing says so."""
