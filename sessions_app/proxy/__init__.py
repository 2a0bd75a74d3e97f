"""The session proxy: the browser reaches a session's program at /s/<id>/ through the platform.

HTTP and WebSocket traffic for a session's URL goes to its node's port over a ``direct-tcpip``
channel of the owner's SSH connection to the login host, so the browser never needs to reach
compute nodes. Only the owner gets through; anyone else gets 404 before the cluster is asked.
The platform's own cookies and Authorization never reach the node; the program's login (what
its session kind says: a cookie, a header) is filled in here. Each request and socket opens a
channel of its own, so a restarted web server simply serves the next one.

- ``target``: which session a request is for, what may reach its program, the tunnel to it
- ``http_proxy``: plain HTTP requests (and a kind's own page at the session's root)
- ``websocket_proxy``: WebSockets, a handshake with the program and then frames both ways
"""
