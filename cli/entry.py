"""The ``warpdeck`` command's first lines, kept light on purpose.

The decision this module protects: a SIGTERM or SIGINT that comes while Python imports the rest of
warpdeck (NumPy, pydantic, the engine: a few hundred milliseconds, seconds on a cold disk) is held
here and handed to ``main``, which then stops the run as any stop does: a report and exit 4
(issue 28). Python's own default would end the process by the signal, without a word. Only the
interpreter's start, before this module's first line, is left to the defaults.
"""

from __future__ import annotations

import signal

HELD = (signal.SIGINT, signal.SIGTERM)
"""The signals held while the command imports."""


def main() -> int:
    """Entry point of the ``warpdeck`` command."""
    caught: list[int] = []

    def hold(signum: int, frame: object) -> None:
        caught.append(signum)

    for sig in HELD:
        signal.signal(sig, hold)
    from warpdeck.cli.main import main as command  # noqa: PLC0415 - imported once the signals are held

    return command(early=caught)
