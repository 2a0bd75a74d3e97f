"""How much of the session proxy one user may hold at once in this web server process.

Every proxied request and WebSocket is a channel over the owner's SSH connection and buffers on
the event loop that all terminals and sessions of the process share; a user who opens without
end would starve everyone else. Counted on the event loop's thread only, so no lock.
"""

from __future__ import annotations

from django.conf import settings

TOO_MANY = "Too many requests to your sessions at once; try again when some have finished."


class UserSlots:
    """Up to the setting's number of slots per user; each taken slot is given back once."""

    def __init__(self, setting: str) -> None:
        self.setting = setting
        self._held: dict[int, int] = {}

    @property
    def limit(self) -> int:
        return int(getattr(settings, self.setting))

    def take(self, user_id: int) -> bool:
        held = self._held.get(user_id, 0)
        if held >= self.limit:
            return False
        self._held[user_id] = held + 1
        return True

    def give_back(self, user_id: int) -> None:
        left = self._held.get(user_id, 0) - 1
        if left > 0:
            self._held[user_id] = left
        else:
            self._held.pop(user_id, None)

    def held(self, user_id: int) -> int:
        return self._held.get(user_id, 0)


requests = UserSlots("ACTIVATE_PROXY_MAX_CONNECTIONS_PER_USER")
websockets = UserSlots("ACTIVATE_PROXY_MAX_WEBSOCKETS_PER_USER")
