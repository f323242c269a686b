"""Errors the tool reports to users: one family, each message one line, fit to print as it is.

    LnFoldError                    anything onnx_lnfold refuses (`except LnFoldError` catches all)
    +-- InvalidInput               the model, an option, a path or the inputs given cannot be used
    +-- CannotWrite                the output (model or report) cannot be written there
    +-- VerificationFailed         the fold is not shown equivalent: nothing written or returned
        +-- NotVerified            ... because the check could not run

The command line exits 1 for a `VerificationFailed` (and its subclass) and 2 for every other
`LnFoldError`; it catches `VerificationFailed` first.
"""


class LnFoldError(Exception):
    """Base of every error onnx_lnfold raises on purpose. The CLI prints the message on one line."""

    def said(self, surface: str) -> str:
        """The message as `surface` ("cli" or "api") says it: the same on both, but for an error
        whose way out names an option, which each surface spells its own way."""
        return str(self)


class InvalidInput(LnFoldError, ValueError):
    """Bad input or usage: a model that cannot be read or kept, an option outside its choices, a
    path that clashes with the input, inputs that do not match the graph. The CLI exits 2."""


class CannotWrite(LnFoldError):
    """The output cannot be written: its folder is missing or read-only, the disk is full. Nothing
    is left behind. The CLI exits 2."""


class VerificationFailed(LnFoldError):
    """The folded model's outputs differ beyond tolerance. Nothing is written; the CLI exits 1."""


class NotVerified(VerificationFailed):
    """Something was folded but the equivalence check could not run (no onnxruntime, the original
    does not run on the inputs, no inputs can be made). Nothing is written; the CLI exits 1."""


class Terminated(KeyboardInterrupt):
    """A SIGTERM (a `timeout`, a job scheduler, `kill`), raised where the command line's run is: it
    unwinds as from a Ctrl-C, its staged output removed, and exits 143. Python's default would end the
    process on the spot and leave the output's staging folder, as large as the model, until the next
    run sweeps it. Not an `LnFoldError`: nothing was refused."""

    exit_code = 128 + 15  # as a shell reports a process a SIGTERM ended


def stopped(e: KeyboardInterrupt) -> tuple[str, int]:
    """How the command line says a run was stopped, and its exit code: a SIGTERM (`Terminated`)
    or a Ctrl-C."""
    return ("terminated", Terminated.exit_code) if isinstance(e, Terminated) else ("interrupted", 130)


__all__ = ["CannotWrite", "InvalidInput", "LnFoldError", "NotVerified", "Terminated", "VerificationFailed", "stopped"]
