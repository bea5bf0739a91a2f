"""The World session's own error: a request it cannot carry out as given (one line that says what to do)."""


class WorldError(ValueError):
    """A request the session cannot carry out as given; the message says what to do."""
