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


class InputWarning(UserWarning):
    """Input that is valid but probably not what the user meant (e.g. an empty diagnoses table);
    the CLI prints ``warning: <message>`` and goes on."""


def check_number(option: str, value: float, *, above: float | None = None, at_least: float | None = None,
                 below: float | None = None) -> float:
    """``value`` of the float option ``option`` as a finite float within the given bounds.

    Every float option goes through here, so NaN and +-inf (which Python's ``float()`` and the
    CLI's parser accept, and which compare false with everything) are refused the same way.

    Raises:
        InputError: not a finite number, or outside the bounds (the message names ``option``).
    """
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise InputError(f"{option} must be a finite number, got {value}")
    if above is not None and not v > above:
        raise InputError(f"{option} must be > {above:g}, got {value}")
    if at_least is not None and not v >= at_least:
        raise InputError(f"{option} must be >= {at_least:g}, got {value}")
    if below is not None and not v < below:
        raise InputError(f"{option} must be < {below:g}, got {value}")
    return v


def check_fractions(option: str, values) -> tuple[float, ...]:
    """Fractions that are each finite and > 0 and sum to 1 (within 1e-9), e.g. ``--split``.

    Raises:
        InputError: naming ``option``.
    """
    fs = tuple(check_number(option, v) for v in values)
    if any(not f > 0 for f in fs) or abs(sum(fs) - 1.0) > 1e-9:
        raise InputError(f"{option} fractions must be positive and sum to 1, got "
                         f"{','.join(f'{f:g}' for f in fs)}")
    return fs
