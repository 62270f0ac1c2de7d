"""The timeline of the Ray workers: :mod:`rlm_course.timeline` (one :class:`Event` type for every
timeline of the course), re-exported here where chapters 12-13 look for it."""

from rlm_course.timeline import (Event, Recorder, busy_seconds, clock_offset, overlap_seconds,
                                 relative, shifted, span, utilisation)

__all__ = ["Event", "Recorder", "busy_seconds", "clock_offset", "overlap_seconds", "relative",
           "shifted", "span", "utilisation"]
