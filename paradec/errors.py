"""User-facing errors.

Every problem a user can fix (a wrong path, a bad flag value, an unsupported checkpoint) is a
``ParadecError`` whose message names the problem and the fix in one line. The CLI prints that
line and exits with status 2; library users catch the exception.
"""


class ParadecError(Exception):
    """A problem with the user's input; the message says what is wrong and how to fix it."""
