"""The SSH transport: the only code that speaks SSH (paramiko), taking and returning plain
values and knowing nothing of Django or the platform.

- ``connection``: one kept connection to a login host, the server's key pinned; counters
- ``commands``: one-shot commands on a channel and their ``CommandResult``
- ``streams``: interactive commands (terminals) with input, output and a pty size
- ``channels``: ``direct-tcpip`` channels to a node's port: seen from asyncio, or one HTTP request
- ``tunnel``: a relay on a login host and the remote forward behind it
- ``hostkeys``: reading and fingerprinting host keys for operators
- ``errors``: what can go wrong, as callers tell the cases apart

``workers_app.cluster_access`` decides which connection serves whom.
"""
