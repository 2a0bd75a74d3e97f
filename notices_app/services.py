"""Telling users what matters about their workers: on the page (a browser notification when the
tab is in the background) and by e-mail, each kind once per worker, as each user chose."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone

from core.statemachine import enqueue_on_commit
from notices_app.models import Notice, NoticeKind, NoticePrefs
from sessions_app.models import Session
from workers_app import walltime
from workers_app.idle import describe_minutes
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

EMAIL_TASK = "notices_app.tasks.email_notice"
WAYS = ("page", "email")


def prefs_of(user: User) -> NoticePrefs:
    return NoticePrefs.objects.filter(user=user).first() or NoticePrefs(user=user)


def save_prefs(user: User, choices: dict[str, bool]) -> NoticePrefs:
    prefs = prefs_of(user)
    for kind in NoticeKind.values:
        for way in WAYS:
            setattr(prefs, f"{kind}_{way}", bool(choices.get(f"{kind}_{way}", False)))
    prefs.save()
    return prefs


def tell(
    worker: Worker, kind: NoticeKind, title: str, body: str, *, subject: str = ""
) -> Notice | None:
    """Record the notice once per worker, kind and subject; e-mail it after commit if the owner
    wants it and has an address. None when told already, or wanted no way at all."""
    prefs = prefs_of(worker.owner)
    by_email = prefs.wants(kind, "email") and bool(worker.owner.email)
    if not (prefs.wants(kind, "page") or by_email):
        return None
    try:
        with transaction.atomic():
            notice = Notice.objects.create(
                user=worker.owner,
                worker=worker,
                kind=kind,
                subject=subject,
                title=title[:200],
                body=body[:500],
            )
    except IntegrityError:
        return None
    if by_email:
        enqueue_on_commit(EMAIL_TASK, notice.pk)
    return notice


def tell_connected(worker: Worker) -> Notice | None:
    where = f" {worker.node_hostname}" if worker.node_hostname else ""
    return tell(
        worker,
        NoticeKind.CONNECTED,
        f"Worker {worker.name} is connected",
        f"Its node{where} ({worker.cluster.name}) is ready for you.",
    )


def warn_walltimes(now: datetime | None = None) -> int:
    """Warn the owners of connected workers whose wall time ends within ACTIVATE_WALLTIME_WARNING
    seconds (once each). Returns how many were warned."""
    now = now or timezone.now()
    ahead = settings.ACTIVATE_WALLTIME_WARNING
    connected = (
        Worker.objects.filter(status=WorkerStatus.CONNECTED)
        .exclude(notices__kind=NoticeKind.WALLTIME)
        .select_related("cluster", "owner")
    )
    warned = 0
    for worker in connected:
        ends = walltime.ends_at(worker)
        if ends is None or (ends - now).total_seconds() > ahead:
            continue
        minutes = max(0, round((ends - now).total_seconds() / 60))
        notice = tell(
            worker,
            NoticeKind.WALLTIME,
            f"Worker {worker.name}: wall time ends in {minutes} min",
            f"Its job ends at {ends:%H:%M} UTC, when the scheduler stops it: save your work, or "
            "request it again.",
        )
        warned += notice is not None
    return warned


def tell_idle_warning(worker: Worker, session: Session | None, ends_at: datetime) -> Notice | None:
    """workers_app.idle warned (its idle_warning signal): tell the owner, as they chose."""
    what = f"Session {session.name}" if session is not None else f"Worker {worker.name}"
    minutes = session.idle_minutes if session is not None else worker.idle_minutes
    ending = "ends" if session is not None else "is deleted"
    return tell(
        worker,
        NoticeKind.IDLE,
        f"{what} is idle: it {ending} at {ends_at:%H:%M} UTC",
        f"Nothing has run or been used on it for a while; after {describe_minutes(minutes or 0)} "
        "idle it " + ending + ". Keep it to start the clock again.",
        subject=session.public_id if session is not None else "",
    )


def take_back_idle_warning(worker: Worker, session: Session | None) -> int:
    """The warning no longer holds (idle_warning_cleared): its notice goes."""
    subject = session.public_id if session is not None else ""
    deleted, _ = Notice.objects.filter(
        worker=worker, kind=NoticeKind.IDLE, subject=subject
    ).delete()
    return deleted


def keep_url(notice: Notice) -> str:
    """Where the page's Keep button posts for an idle warning ("" for other notices)."""
    if notice.kind != NoticeKind.IDLE:
        return ""
    if notice.subject:
        return reverse("sessions:keep", args=[notice.subject])
    return reverse("pages:keep-worker", args=[notice.worker.public_id])


def email_notice(notice_id: int) -> bool:
    """Send a notice's e-mail, at least once: marked sent only after the mail server took it,
    so a failure is retried and a sent one is not sent again."""
    notice = Notice.objects.select_related("user").filter(pk=notice_id, emailed=False).first()
    if notice is None or not notice.user.email:
        return False
    base = settings.ACTIVATE_PUBLIC_URL.rstrip("/")
    send_mail(
        subject=notice.title,
        message=f"{notice.body}\n\n{base}/workers/\n\nWhat you are told, and how: {base}/notices/",
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[notice.user.email],
    )
    Notice.objects.filter(pk=notice.pk).update(emailed=True)
    return True


def shown_to(user: User, *, after: int) -> QuerySet[Notice]:
    """The user's notices after ``after`` that they want on the page, oldest first."""
    prefs = prefs_of(user)
    kinds = [kind for kind in NoticeKind.values if prefs.wants(kind, "page")]
    return (
        Notice.objects.filter(user=user, id__gt=after, kind__in=kinds)
        .select_related("worker")
        .order_by("id")
    )


def last_id(user: User) -> int:
    last = Notice.objects.filter(user=user).order_by("-id").values_list("id", flat=True).first()
    return last or 0
