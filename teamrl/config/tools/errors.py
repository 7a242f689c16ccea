"""The one exception of configuration problems: every problem found, one line each."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """One or more problems with a configuration.

    ``errors`` holds one message per problem; ``str()`` lists them all, one
    per line, under a ``"N config error(s):"`` header.  A single message may
    be passed as a plain string, e.g. from a ``__post_init__``.
    """

    def __init__(self, errors: str | Iterable[str]) -> None:
        if isinstance(errors, str):
            errors = [errors]
        self.errors: list[str] = [str(e) for e in errors]
        # The list itself is the only argument so that pickling round-trips.
        super().__init__(self.errors)

    def __str__(self) -> str:
        lines = [f"{len(self.errors)} config error(s):"]
        lines.extend(f"  {e}" for e in self.errors)
        return "\n".join(lines)
