"""JupyterLab: Jupyter Server on a Unix socket in the session's private folder, under the
session's base URL, its token (the session's password) in its environment, opened on the
session's folder, the owner's home unless told (options: --jupyter-lab PATH, --base-url
/s/<id>/).

Its kernels talk to it over ZMQ's ipc transport, not TCP: a kernel's IOPub is a PUB socket
that gives every cell's output to whoever subscribes, and on 127.0.0.1 that is any user of
the node. Its runtime folder, where the kernels' connection files go and with them their ipc
sockets (named after them), and the server's own jpserver-*.json and cookie secret, is the
session's private folder."""

import os
from typing import TYPE_CHECKING, Dict

if TYPE_CHECKING:
    from ..activate_session import Launcher  # the launcher these run in, on the node too


def start(launcher: "Launcher", secret: str, options: Dict[str, str]) -> None:
    jupyter_lab = options.get("--jupyter-lab", "jupyter-lab")
    program = launcher.find(jupyter_lab)
    if not program:
        launcher.fail("JupyterLab is not installed on the node (%s)" % jupyter_lab)
    # Read by Jupyter Server as its token: never in argv, which other users may read. Its
    # runtime folder is named only in the environment (ServerApp.runtime_dir is no option).
    env = dict(os.environ, JUPYTER_TOKEN=secret, JUPYTER_RUNTIME_DIR=launcher.workdir)
    launcher.start(
        [
            program,
            "--no-browser",
            "--ServerApp.sock=%s" % launcher.route("http"),
            "--ServerApp.sock_mode=0600",
            "--ServerApp.base_url=%s" % options.get("--base-url", "/"),
            "--ServerApp.root_dir=%s" % launcher.folder,
            # The browser's Host is the platform's address, not this node's.
            "--ServerApp.allow_remote_access=True",
            "--ServerApp.password=",
            "--KernelManager.transport=ipc",
            # Nothing to fetch from outside the cluster.
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env,
        cwd=launcher.folder,
    )
