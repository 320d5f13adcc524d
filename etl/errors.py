"""User-facing errors shared by every package.

An :class:`InputError` is bad input from the user (a missing table or column, an
unreadable file, an empty cohort, an unknown option value). The CLI prints its
message as one line and exits with code 2, without a traceback. Messages name the
file, column, filter or option at fault and never carry row-level values
(no subject_id, hadm_id, stay_id or feature row).
"""

from __future__ import annotations


class InputError(Exception):
    """Bad user input; the CLI reports ``error: <message>`` and exits 2."""
