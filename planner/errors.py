"""The one exception type users see.

Every mistake a user can make (unknown GPU, malformed plan, infeasible
constraints) raises `SailorError` with one line that names the problem and
says what to do. The CLI prints it and exits with code 2; nothing else in the
package prints.
"""


class SailorError(Exception):
    """A user-facing problem, explained in one line."""

    exit_code = 2
