"""A folder on a cluster that something opens in (a terminal, a session's program): as a person
names it, checked, and how a command is run there without a shell ever reading the name.

A folder is absolute, or the owner's home ("~", "~/..."), expanded on the node, where the home
is; any byte but NUL may be in it. The OS says whether the owner may enter it.
"""

from __future__ import annotations

from core.errors import ParameterError

MAX_FOLDER = 4096

# sh -c IN_FOLDER activate-folder FOLDER [ARGV...]: the folder and the argv are the script's
# arguments, never its text. No argv: the login shell the login host names.
IN_FOLDER = (
    'd=$1; shift; case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; esac; '
    'cd -- "$d" 2>/dev/null || { printf "activate: cannot open the folder %s\\n" "$d" >&2; '
    "exit 1; }; "
    'if [ $# -eq 0 ]; then exec "${SHELL:-/bin/sh}" -l; fi; exec "$@"'
)


def checked_folder(value: object, field: str = "folder") -> str:
    """The folder asked for ("" for none: the home), or ParameterError naming ``field``."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise ParameterError(field, "must be a string")
    if "\x00" in value:
        raise ParameterError(field, "a folder cannot hold a NUL byte")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ParameterError(field, "must be UTF-8 text") from None
    if size > MAX_FOLDER:
        raise ParameterError(field, f"a folder is at most {MAX_FOLDER} bytes")
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        raise ParameterError(field, 'must be absolute, or "~" or "~/..." for your home')
    return value


def in_folder(folder: str, argv: list[str]) -> list[str]:
    """argv (none: a login shell) run in ``folder`` on the node."""
    if not folder:
        return argv
    return ["sh", "-c", IN_FOLDER, "activate-folder", folder, *argv]
