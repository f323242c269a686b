"""Errors the tool reports to users. Each message is one line, fit to print as it is."""


class LnFoldError(Exception):
    """Bad input or usage. The CLI prints the message on one line and exits 2."""


class VerificationFailed(Exception):
    """The folded model's outputs differ beyond tolerance. Nothing is written; the CLI exits 1."""


class NotVerified(VerificationFailed):
    """Something was folded but the equivalence check could not run (no onnxruntime, the original
    does not run on the inputs, no inputs can be made). Nothing is written; the CLI exits 1."""
