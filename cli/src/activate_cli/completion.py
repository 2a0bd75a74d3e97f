"""pw completion bash|zsh: a completion script generated from pw's own argument parser.

The parser is walked once into a few tables (the sub-commands, options and option values at
each command path); each table becomes a small shell function of `case` branches that bash and
zsh both read, and a shell-specific function walks the words typed so far through them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from activate_cli import sessions

SHELLS = ("bash", "zsh")
# An option whose metavar is FILE completes file names.
FILE_METAVAR = "FILE"
# Options whose values only the server knows: completed with what this pw command prints.
LISTED_METAVARS = {sessions.TYPE_METAVAR: sessions.TYPES_COMMAND}


@dataclass
class Tables:
    # (path, word typed) -> the canonical path it leads to; aliases lead to the same path.
    steps: dict[tuple[str, str], str] = field(default_factory=dict)
    # path -> (word, help) offered there: sub-commands by their main name, positional choices.
    words: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    options: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # path -> options there that take a value (so the next word is that value, not a command).
    valued: dict[str, list[str]] = field(default_factory=dict)
    values: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    files: set[tuple[str, str]] = field(default_factory=set)
    listed: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)


def joined(path: str, name: str) -> str:
    return f"{path} {name}" if path else name


def walk(parser: argparse.ArgumentParser, path: str, tables: Tables) -> None:
    words: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    valued: list[str] = []
    # argparse has no public way to list a parser's arguments; _actions is what it uses itself.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: dict[int, str] = {}
            for name, sub in action.choices.items():
                # A parser's main name comes first, then its aliases.
                main = seen.setdefault(id(sub), name)
                tables.steps[(path, name)] = joined(path, main)
                if main == name:
                    words.append((name, helps.get(name, "")))
                    walk(sub, joined(path, name), tables)
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            options += [(o, action.help or "") for o in action.option_strings]
            if action.nargs != 0:
                valued += action.option_strings
                for option in action.option_strings:
                    if action.choices:
                        tables.values[(path, option)] = [str(c) for c in action.choices]
                    elif action.metavar == FILE_METAVAR:
                        tables.files.add((path, option))
                    elif isinstance(action.metavar, str) and action.metavar in LISTED_METAVARS:
                        tables.listed[(path, option)] = LISTED_METAVARS[action.metavar]
        elif action.choices:
            words += [(str(c), "") for c in action.choices]
    tables.words[path] = words
    tables.options[path] = options
    tables.valued[path] = valued


def tables_of(parser: argparse.ArgumentParser) -> Tables:
    tables = Tables()
    walk(parser, "", tables)
    return tables


def quoted(text: str) -> str:
    """Single-quoted for bash and zsh alike."""
    return "'" + text.replace("'", "'\\''") + "'"


def case_function(
    name: str, subject: str, branches: dict[str, str], *, otherwise: str = ""
) -> Iterator[str]:
    yield f"{name}() {{"
    yield f'    case "{subject}" in'
    for pattern, body in branches.items():
        if body:
            yield f"        {quoted(pattern)}) {body} ;;"
    yield "    esac"
    if otherwise:
        yield f"    {otherwise}"
    yield "}"


def echo(words: list[str]) -> str:
    return f"echo {quoted(' '.join(words))}" if words else ""


def described(items: list[tuple[str, str]]) -> str:
    """One `word:help` line each, as zsh's _describe takes them."""
    entries = [word.replace(":", r"\:") + ":" + " ".join(text.split()) for word, text in items]
    return "printf '%s\\n' " + " ".join(quoted(e) for e in entries) if entries else ""


def tables_script(prog: str, tables: Tables) -> Iterator[str]:
    f = f"_{prog}"
    yield from case_function(
        f"{f}_step", "$1|$2", {f"{p}|{w}": echo([to]) for (p, w), to in tables.steps.items()}
    )
    yield from case_function(
        f"{f}_words", "$1", {p: echo([w for w, _ in ws]) for p, ws in tables.words.items()}
    )
    yield from case_function(
        f"{f}_options", "$1", {p: echo([o for o, _ in os]) for p, os in tables.options.items()}
    )
    yield from case_function(f"{f}_valued", "$1", {p: echo(vs) for p, vs in tables.valued.items()})
    yield from case_function(
        f"{f}_values", "$1|$2", {f"{p}|{o}": echo(vs) for (p, o), vs in tables.values.items()}
    )
    yield from case_function(
        f"{f}_files",
        "$1|$2",
        {f"{p}|{o}": "return 0" for p, o in sorted(tables.files)},
        otherwise="return 1",
    )
    yield from case_function(
        f"{f}_listed", "$1|$2", {f"{p}|{o}": echo(list(c)) for (p, o), c in tables.listed.items()}
    )


# Shared by both shells: walks words[first..current-1] into $cmdpath, sets $expects_value when
# the word being completed is an option's value. (`path` is taken in zsh: it mirrors $PATH.)
WALK = """\
{f}_walk() {{
    local first=$1 current=$2 i word next
    cmdpath="" expects_value=0
    for ((i = first; i < current; i++)); do
        word="${{words[i]}}"
        if ((expects_value)); then
            expects_value=0
        elif [[ "$word" == -* ]]; then
            [[ "$word" != *=* && " $({f}_valued "$cmdpath") " == *" $word "* ]] && expects_value=1
        else
            next="$({f}_step "$cmdpath" "$word")"
            [[ -n "$next" ]] && cmdpath="$next"
        fi
    done
}}
"""

BASH_MAIN = """\
{f}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local cmdpath expects_value
    local -a words=("${{COMP_WORDS[@]}}")
    {f}_walk 1 "$COMP_CWORD"
    if ((expects_value)); then
        if {f}_files "$cmdpath" "$prev"; then
            COMPREPLY=($(compgen -f -- "$cur"))
        else
            local listed values
            listed="$({f}_listed "$cmdpath" "$prev")"
            if [[ -n "$listed" ]]; then
                values="$("${{words[0]}}" $listed 2>/dev/null)"
            else
                values="$({f}_values "$cmdpath" "$prev")"
            fi
            COMPREPLY=($(compgen -W "$values" -- "$cur"))
        fi
    elif [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$({f}_options "$cmdpath")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$({f}_words "$cmdpath")" -- "$cur"))
    fi
}}
complete -F {f} {prog}
"""

ZSH_MAIN = """\
{f}() {{
    local cmdpath expects_value prev="${{words[CURRENT-1]}}"
    local -a described
    {f}_walk 2 "$CURRENT"
    if ((expects_value)); then
        local listed="$({f}_listed "$cmdpath" "$prev")"
        if {f}_files "$cmdpath" "$prev"; then
            _files
        elif [[ -n "$listed" ]]; then
            compadd -- $("${{words[1]}}" ${{=listed}} 2>/dev/null)
        else
            compadd -- $({f}_values "$cmdpath" "$prev")
        fi
    elif [[ "${{words[CURRENT]}}" == -* ]]; then
        described=(${{(f)"$({f}_described_options "$cmdpath")"}})
        _describe -t options option described
    else
        described=(${{(f)"$({f}_described_words "$cmdpath")"}})
        _describe -t commands command described
    fi
}}

# Installed as a file named {f} in $fpath, or sourced: `source <({prog} completion zsh)`.
if [[ "${{zsh_eval_context[-1]}}" == loadautofunc ]]; then
    {f} "$@"
else
    compdef {f} {prog}
fi
"""


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    f = f"_{prog}"
    tables = tables_of(parser)
    parts = [f"#compdef {prog}" if shell == "zsh" else f"# bash completion for {prog}"]
    parts.append(f"# Generated by `{prog} completion {shell}`; regenerate after upgrading {prog}.")
    parts += tables_script(prog, tables)
    if shell == "zsh":
        parts += case_function(
            f"{f}_described_words", "$1", {p: described(ws) for p, ws in tables.words.items()}
        )
        parts += case_function(
            f"{f}_described_options", "$1", {p: described(os) for p, os in tables.options.items()}
        )
    parts.append(WALK.format(f=f))
    parts.append((ZSH_MAIN if shell == "zsh" else BASH_MAIN).format(f=f, prog=prog))
    return "\n".join(parts)


def add_parser(
    commands: Any, common: argparse.ArgumentParser, root: argparse.ArgumentParser
) -> None:
    p = commands.add_parser(
        "completion",
        help="print a shell completion script",
        description=(
            'bash: eval "$(pw completion bash)" in ~/.bashrc; '
            "zsh: source <(pw completion zsh) in ~/.zshrc"
        ),
        parents=[common],
    )
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")

    def show(args: argparse.Namespace) -> int:
        sys.stdout.write(script(args.shell, root))
        return 0

    p.set_defaults(run=show, needs_client=False)
