"""Run a test once per HTTP transport (``http_transport`` python and native).

``each_http_transport`` is a parametrized fixture: while the test runs, every
``Settings.build`` that does not name ``http_transport`` itself serves HTTP on the
parameter's transport (the native one is skipped where the tierserve-native package is not
installed).  A test or module opts in with ``pytest.mark.usefixtures("each_http_transport")``;
:func:`cli_args` gives the same choice to a server started from the command line.
"""

from __future__ import annotations

import pytest

from tierserve.server.grpc.native import native_available
from tierserve.server.settings import Settings

TRANSPORTS = [
    "python",
    pytest.param(
        "native",
        marks=pytest.mark.skipif(not native_available(), reason="tierserve-native not installed"),
    ),
]


@pytest.fixture(params=TRANSPORTS)
def each_http_transport(request, monkeypatch) -> str:
    """The transport of this run; ``Settings.build`` defaults to it meanwhile."""
    transport = request.param
    build = Settings.build.__func__

    def build_on_transport(cls, **values):
        return build(cls, **{"http_transport": transport, **values})

    monkeypatch.setattr(Settings, "build", classmethod(build_on_transport))
    return transport


def cli_args(transport: str) -> list[str]:
    """``tierserve serve`` arguments choosing ``transport`` for HTTP."""
    return ["--http-transport", transport]
