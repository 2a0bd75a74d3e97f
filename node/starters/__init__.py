"""Node starters, one per session kind: each is sent with the launcher (``activate_session.py``)
and run on the node as a module of its own, standard-library Python 3.6+ that imports nothing of
the platform. Its ``start(launcher, secret, options)`` starts the kind's program listening on
the Unix sockets it asks for with ``launcher.route(name)`` (``http`` is the program's web
server); the launcher waits for them, then opens its gate to them and reports it."""
