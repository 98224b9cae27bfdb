"""The service room's one ``service`` fixture: a real service process per module.

A module that needs other settings than ``ServiceProcess``'s defaults (4 sim devices, 2 workers each,
digits) overrides ``service_settings``::

    @pytest.fixture(scope="module")
    def service_settings():
        return {"MODELS": "digits,faulty", "MAX_BODY_BYTES": 200_000}
"""

from __future__ import annotations

import pytest
from support.servers import ServiceProcess


@pytest.fixture(scope="module")
def service_settings() -> dict:
    """``PLACEENV_*`` settings, without the prefix, of this module's ``service``."""
    return {}


@pytest.fixture(scope="module")
def service(service_settings):
    """``python -m placeenv.serve`` on 127.0.0.1 with ``service_settings``, ready, shared by the module's
    tests; it must still be running when they are done."""
    with ServiceProcess(**service_settings) as proc:
        yield proc
        assert proc.proc.poll() is None, f"the service died during the module's tests:\n{proc.output()[-6000:]}"
