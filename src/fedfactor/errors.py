"""The one exception type for bad input.

The CLI turns a UsageError into a single line on stderr and exit status 2, before any output is
written, so every check on user input raises this and nothing else.
"""


class UsageError(Exception):
    """Bad input: an unknown name, an impossible setting, a corrupt file."""
