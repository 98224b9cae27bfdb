"""A clock the test moves by hand, for ``DeviceQueue(..., clock=ManualClock())``.

Time stands still until ``advance``: a waiting worker wakes either because the queue notified it
(a job arrived) or because the test moved time past its wait's deadline (``advance`` wakes it and
marks the wait as timed out), never because the machine was slow. ``log`` says which, for every
wait, so a test asserts how a batch went, not how long it took.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

#: The longest a wait may block in real time before the test is declared stuck (a bug, not a result).
STUCK_S = 30.0
#: Deadlines within this of each other are the same instant (0.05 * 4 is not 0.2 in binary).
EPSILON = 1e-9


@dataclass(eq=False)
class _Sleeper:
    condition: threading.Condition
    deadline: float
    #: Set by ``advance``, under the condition, when time reached this wait's deadline.
    due: bool = False
    #: Set by ``advance`` when it woke the condition for another of its sleepers: not a notify.
    poked: bool = False
    ended: threading.Event = field(default_factory=threading.Event)


class ManualClock:
    """``now()`` and ``wait(condition, timeout)`` as ``placeenv.serve.engine.dispatch.Clock`` has them, on a
    time that only ``advance`` moves."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._sleepers: list[_Sleeper] = []
        #: Every wait that ended, in order: ("notified" | "timed out", its timeout, the time it ended).
        self.log: list[tuple[str, float, float]] = []

    def now(self) -> float:
        return self._now

    @property
    def sleeping(self) -> int:
        """Threads waiting on this clock now."""
        with self._lock:
            return len(self._sleepers)

    def wait(self, condition: threading.Condition, timeout: float) -> bool:
        """Called with ``condition`` held, as ``Condition.wait``; True if notified, False at the deadline.

        The wait has no real timeout: a timed ``Condition.wait`` that times out as a notify comes
        returns False with the notify spent (CPython removes the waiter only after it has the lock
        again), which lost the queue's wake-up on a busy machine. ``advance`` wakes a wait whose
        deadline it reached instead, and says so on the sleeper.
        """
        sleeper = _Sleeper(condition, self._now + timeout, due=timeout <= EPSILON)
        with self._lock:
            self._sleepers.append(sleeper)
        try:
            while not sleeper.due:
                if not condition.wait(STUCK_S):
                    raise TimeoutError(f"a wait on the manual clock did not end in {STUCK_S:g} s of real time "
                                       "(nothing notified it, and advance() did not reach its deadline)")
                if not sleeper.poked:
                    break
                sleeper.poked = False  # advance() woke the condition for another sleeper: wait on
            notified = not sleeper.due
        finally:
            with self._lock:
                self._sleepers.remove(sleeper)
        self.log.append(("notified" if notified else "timed out", timeout, self._now))
        sleeper.ended.set()  # still holding the condition: advance() takes it once we wait again or leave
        return notified

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, stopping at each wait's deadline on the way and going on only
        once the thread it woke has waited again or let go of its condition (left the queue's call):
        what a worker does at a deadline is over before the test's next step."""
        target = self._now + seconds
        while True:
            with self._lock:
                due = [s for s in self._sleepers if s.deadline <= target + EPSILON]
            if not due:
                break
            first = min(due, key=lambda s: s.deadline)
            self._now = max(self._now, first.deadline)
            with first.condition:  # the sleeper waits on it (or is about to, holding it): wake it
                first.due = True
                with self._lock:
                    for other in self._sleepers:
                        if other is not first and other.condition is first.condition:
                            other.poked = True
                first.condition.notify_all()
            if not first.ended.wait(STUCK_S):
                raise TimeoutError("a wait whose deadline passed did not end")
            with first.condition:  # the woken thread holds it until it waits again or returns
                pass
        self._now = max(self._now, target)
