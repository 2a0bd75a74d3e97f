"""Terminals on workers' nodes: a WebSocket per terminal, a PTY in the job over the owner's SSH.

``service`` decides who may open one and records it; ``consumer`` is the thin WebSocket end.
"""
