"""What every page needs to pick up new notices: the id of the user's last one when it loaded."""

from __future__ import annotations

from django.http import HttpRequest

from notices_app import services


def notices(request: HttpRequest) -> dict[str, object]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"notice_after": lambda: services.last_id(user)}
