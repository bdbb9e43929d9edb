"""The engine's error: what a run raises when it cannot go on (the CLI prints it as one message)."""


class PipelineError(RuntimeError):
    """The run cannot go on; the message says why and what to do."""
