"""Node starters, one per session kind: each is sent with the launcher (``activate_session.py``)
and run on the node as a module of its own, standard-library Python 3.6+ that imports nothing of
the platform. Its ``start(launcher, secret, port, options)`` starts the kind's program so that
it answers on ``port``; the launcher waits for that and reports it."""
