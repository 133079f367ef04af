"""User-facing errors: one line that says what is wrong and what to do."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input or invocation; the CLI prints it on one line and exits 2."""

    def __init__(self, what: str, fix: str = "") -> None:
        self.what = what
        self.fix = fix
        super().__init__(f"{what}" + (f" — {fix}" if fix else ""))


class TraceError(UserError):
    """A trace directory that cannot be read or does not follow the contract."""
