"""Which beats the agents' server takes on, in each of its processes: shed, not collapse.

A beat is admitted while the process's event loop runs on time (no later than the budget) and
fewer than a bound of beats are between admission and answer; else it is shed: answered a
signed "retry after N s" (agents/errors.py: Overloaded) once its signature is checked, before
any database or Redis work. How late the loop runs is what every beat waiting in it waits: a
ticker sleeps a short while again and again, and the loop is as late as its wake-up is (the
one due and not yet run counts as soon as it is due, so a loop that is stuck is seen at once).

N is one second plus the seconds this process would take, at the rate it admits, to answer
what it shed in the last second or two, times a random factor of 1 to 2 (so a herd told to go
away does not come back at once), at most ``retry_after_max``. The shed beats are counted
and, once a second, noted in Redis for the heartbeat sweep (workers_app.liveness.ShedRecord).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from agents.errors import Overloaded

log = logging.getLogger(__name__)

# How often the ticker wakes (seconds), and how often the counts roll over and sheds are noted.
TICK = 0.02
ROLL = 1.0


class AdmissionGate:
    """The admission of beats in one process of the agents' server."""

    def __init__(
        self,
        *,
        budget: float,
        in_flight_limit: int,
        retry_after_max: float,
        note_shed: Callable[[int], Awaitable[None]],
    ) -> None:
        self.budget = budget  # seconds
        self.in_flight_limit = in_flight_limit
        self.retry_after_max = retry_after_max
        self.note_shed = note_shed
        self.in_flight = 0
        self.lag = 0.0  # how late the ticker last woke (seconds)
        self.due = 0.0  # when it is due to wake next (the loop's clock)
        self.admitted = [0, 0]  # this second's and the last one's
        self.shed = [0, 0]
        self.unnoted = 0
        self.ticker: asyncio.Task[None] | None = None
        self.noting: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start watching the loop (once; the server calls it at start-up and on each beat)."""
        if self.ticker is None:
            loop = asyncio.get_running_loop()
            self.due = loop.time() + TICK
            self.ticker = loop.create_task(self._watch())

    def stop(self) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
            self.ticker = None

    def admit(self) -> None:
        """Take a beat on (``done`` when answered), or Overloaded with its retry-after."""
        late = max(self.lag, asyncio.get_running_loop().time() - self.due)
        if late > self.budget or self.in_flight >= self.in_flight_limit:
            self.shed[0] += 1
            self.unnoted += 1
            raise Overloaded(self.retry_after())
        self.in_flight += 1
        self.admitted[0] += 1

    def done(self) -> None:
        self.in_flight -= 1

    def retry_after(self) -> float:
        shed = self.shed[0] + self.shed[1]
        admitted = max(1, self.admitted[0] + self.admitted[1])
        jitter = 1.0 + random.random()  # noqa: S311 - spreads a herd; nothing secret rides on it
        seconds = (1.0 + shed / admitted) * jitter
        return min(self.retry_after_max, seconds)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        rolled = loop.time()
        while True:
            await asyncio.sleep(TICK)
            now = loop.time()
            self.lag = max(0.0, now - self.due)
            self.due = now + TICK
            if now - rolled >= ROLL:
                rolled = now
                self.admitted = [0, self.admitted[0]]
                self.shed = [0, self.shed[0]]
                if self.unnoted and self.noting is None:
                    # Apart from the ticker, which must not wait for Redis to keep time.
                    self.noting = loop.create_task(self._note())

    async def _note(self) -> None:
        count, self.unnoted = self.unnoted, 0
        log.warning(
            "shed %d beats since the last note (admitted %d in the last second)",
            count,
            self.admitted[1],
        )
        try:
            await self.note_shed(count)
        except Exception as exc:
            # Whatever failed (Redis down), the count waits for the next note.
            self.unnoted += count
            log.warning("%d beats shed not noted: %s", count, exc)
        finally:
            self.noting = None
