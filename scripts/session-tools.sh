#!/usr/bin/env bash
# What sessions run on the test node (this machine): a VNC desktop with noVNC, code-server,
# JupyterLab, and the operators' apps of docs/apps/ (TensorBoard, marimo).
#   scripts/session-tools.sh     installs what is missing (needs root or sudo); idempotent
#
# Desktop: Debian's TigerVNC, xauth, noVNC's files and xterm. VS Code: code-server, pinned, built
# once into $CODE_SERVER_CACHE (outside the repository, kept between CI runs on one machine)
# and put on PATH as /usr/local/bin/code-server. Its npm post-install steps download binaries
# and need build headers, so they are skipped and done here by hand with Debian's pieces.
# Jupyter: JupyterLab from PyPI, pinned, in a virtual environment of its own made with Debian's
# python3 in $JUPYTER_CACHE (its kernel is that environment's Python), put on PATH as
# /usr/local/bin/jupyter-lab.
# Operators' apps (docs/apps/*.yaml): TensorBoard and marimo from PyPI, pinned, each the same
# way in a virtual environment of its own under $APPS_CACHE, its command put on PATH in
# /usr/local/bin.
set -euo pipefail
CODE_SERVER_VERSION="${CODE_SERVER_VERSION:-4.100.3}"
CODE_SERVER_CACHE="${CODE_SERVER_CACHE:-/var/cache/activate/code-server}"
JUPYTERLAB_VERSION="${JUPYTERLAB_VERSION:-4.6.6}"
JUPYTER_CACHE="${JUPYTER_CACHE:-/var/cache/activate/jupyter}"
TENSORBOARD_VERSION="${TENSORBOARD_VERSION:-2.21.0}"
MARIMO_VERSION="${MARIMO_VERSION:-0.25.2}"
APPS_CACHE="${APPS_CACHE:-/var/cache/activate}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

packages=(tigervnc-standalone-server xauth novnc xterm libkrb5-dev ripgrep
    build-essential python3 python3-venv)
# Node.js 20 from another source may already be there (with its npm): then it is used.
command -v node >/dev/null || packages+=(nodejs)
command -v npm >/dev/null || packages+=(npm)
missing=()
for package in "${packages[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

target="$CODE_SERVER_CACHE/$CODE_SERVER_VERSION"
if [ ! -f "$target/.complete" ]; then
    build="$(mktemp -d)"
    trap 'rm -rf "$build"' EXIT
    cd "$build"
    npm install --no-audit --no-fund --ignore-scripts "code-server@$CODE_SERVER_VERSION" >/dev/null
    npm rebuild argon2 >/dev/null
    cd node_modules/code-server/lib/vscode
    npm install --no-audit --no-fund --omit=dev --ignore-scripts >/dev/null
    mkdir -p node_modules/@vscode/ripgrep/bin
    cp "$(command -v rg)" node_modules/@vscode/ripgrep/bin/rg
    npm_config_yes=true npm rebuild kerberos @parcel/watcher @vscode/deviceid @vscode/spdlog \
        native-watchdog node-pty >/dev/null
    # What code-server's postinstall.sh would have made.
    ln -sfn node_modules node_modules.asar
    ln -sfn code-linux.sh bin/remote-cli/code-server
    ln -sfn browser-linux.sh bin/helpers/browser.sh
    (cd extensions && npm install --no-audit --no-fund --omit=dev --ignore-scripts >/dev/null)
    cd "$build"
    $SUDO mkdir -p "$CODE_SERVER_CACHE"
    $SUDO rm -rf "$target"
    $SUDO mkdir -p "$target"
    $SUDO cp -a "$build/node_modules" "$target/node_modules"
    $SUDO chmod -R a+rX "$target"
    $SUDO touch "$target/.complete"
fi

wrapper=/usr/local/bin/code-server
wanted="#!/bin/sh
exec node $target/node_modules/code-server/out/node/entry.js \"\$@\""
if [ "$(cat "$wrapper" 2>/dev/null)" != "$wanted" ]; then
    printf '%s\n' "$wanted" | $SUDO tee "$wrapper" >/dev/null
    $SUDO chmod 755 "$wrapper"
fi
code-server --version 2>/dev/null | head -1

jupyter="$JUPYTER_CACHE/$JUPYTERLAB_VERSION"
if [ ! -f "$jupyter/.complete" ]; then
    # Made where it stays: a virtual environment's scripts name its own path.
    $SUDO rm -rf "$jupyter"
    $SUDO mkdir -p "$JUPYTER_CACHE"
    $SUDO /usr/bin/python3 -m venv "$jupyter"
    $SUDO "$jupyter/bin/pip" install --quiet --disable-pip-version-check \
        "jupyterlab==$JUPYTERLAB_VERSION"
    $SUDO chmod -R a+rX "$jupyter"
    $SUDO touch "$jupyter/.complete"
fi
# No news or update prompts: the node need not reach the internet, nor the user answer.
overrides="$jupyter/share/jupyter/lab/settings/overrides.json"
wanted_overrides='{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}'
if [ "$(cat "$overrides" 2>/dev/null)" != "$wanted_overrides" ]; then
    $SUDO mkdir -p "$(dirname "$overrides")"
    printf '%s\n' "$wanted_overrides" | $SUDO tee "$overrides" >/dev/null
fi
if [ "$(readlink /usr/local/bin/jupyter-lab 2>/dev/null)" != "$jupyter/bin/jupyter-lab" ]; then
    $SUDO ln -sfn "$jupyter/bin/jupyter-lab" /usr/local/bin/jupyter-lab
fi
echo "jupyterlab $(jupyter-lab --version 2>/dev/null)"

# pypi_app PACKAGE VERSION COMMAND: PACKAGE==VERSION in $APPS_CACHE/PACKAGE/VERSION, its COMMAND
# linked from /usr/local/bin.
pypi_app() {
    local package="$1" version="$2" command="$3"
    local venv="$APPS_CACHE/$package/$version"
    if [ ! -f "$venv/.complete" ]; then
        $SUDO rm -rf "$venv"
        $SUDO mkdir -p "$APPS_CACHE/$package"
        $SUDO /usr/bin/python3 -m venv "$venv"
        $SUDO "$venv/bin/pip" install --quiet --disable-pip-version-check "$package==$version"
        $SUDO chmod -R a+rX "$venv"
        $SUDO touch "$venv/.complete"
    fi
    if [ "$(readlink "/usr/local/bin/$command" 2>/dev/null)" != "$venv/bin/$command" ]; then
        $SUDO ln -sfn "$venv/bin/$command" "/usr/local/bin/$command"
    fi
}
pypi_app tensorboard "$TENSORBOARD_VERSION" tensorboard
echo "tensorboard $(tensorboard --version 2>/dev/null)"
pypi_app marimo "$MARIMO_VERSION" marimo
echo "marimo $(marimo --version 2>/dev/null)"
