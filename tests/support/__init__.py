"""What the tests share: thread helpers, a poll-until-true wait, a hand-driven clock.

    from support import run_threads, wait_until, where
    from support.servers import ServiceProcess          # real service processes (imports httpx)
    from support.dashboards import dashboard_exprs      # the Grafana dashboards' PromQL

``tests/`` is on ``sys.path`` because ``tests/conftest.py`` lives there (pytest's rootdir
imports), so every test folder imports this package the same way.
"""

from .clock import ManualClock
from .polling import WaitTimeout, wait_until, wait_until_async
from .threads import DEVICES, THREAD_DEVICES, blocked_at, expect, on_each_device, run_threads, where

__all__ = ["DEVICES", "THREAD_DEVICES", "ManualClock", "WaitTimeout", "blocked_at", "expect",
           "on_each_device", "run_threads", "wait_until", "wait_until_async", "where"]
