"""Input errors: a file (or array) that cannot be this pipeline's input.

The decision this module protects: whether a failed attempt is retried is decided by the class
of its error, not by where it was raised. An input error is deterministic (the same bytes give
the same refusal), so its task fails at once, naming the file and the reason, and neither the
feeder nor the run stops. Anything else (a stage that raises, a sink that fails) keeps the
spec's retry policy.
"""

from __future__ import annotations

__all__ = ["InputError", "retryable"]


class InputError(ValueError):
    """``path`` cannot be used as this pipeline's input, because of ``reason`` (unsupported dtype,
    pickled objects, wrong shape, bad header, truncated, unreadable, not a regular file, gone)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        """The input's path (or key, for an input that is not a file)."""
        self.reason = reason
        """Why it cannot be used, in words a user can act on."""

    def __reduce__(self) -> tuple[type[InputError], tuple[str, str]]:
        # Errors cross process boundaries (Ray workers): keep both fields.
        return (InputError, (self.path, self.reason))


def retryable(exc: BaseException) -> bool:
    """Whether another attempt could end differently: not for an input error."""
    return not isinstance(exc, InputError)
