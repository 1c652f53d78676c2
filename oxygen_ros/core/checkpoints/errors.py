"""The one error type of checkpoint loading."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint (or a file it needs) cannot be used; the message says what to fix.

    ``problems`` lists every individual finding (missing, unexpected and
    mis-shaped tensors are all reported together, by name). ``parameter``: the
    node parameter to fix when it is not ``model_path`` (a given tokenizer or
    statistics file).
    """

    def __init__(self, message: str, problems: list[str] | None = None, *, parameter: str | None = None):
        self.problems = list(problems or [])
        self.parameter = parameter
        self.headline = message  # the message without its problems
        if self.problems:
            message = message + "\n  " + "\n  ".join(self.problems)
        super().__init__(message)
