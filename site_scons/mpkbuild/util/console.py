"""One place that writes the build's own lines to stdout.

Each line goes out in one write: gate actions print from SCons's worker threads under -jN,
and print()'s separate write of the newline let another thread's line land in between. A
reader that went away (`| head`) ends the printing quietly, not in a BrokenPipeError
traceback; the exit status stays.
"""
from __future__ import annotations

import os
import sys
import threading


class _Output:
    """stdout, one line a call (see the module's docstring)."""
    closed = False
    _lock = threading.Lock()

    def __call__(self, text: str = "") -> None:
        if self.closed:
            return
        try:
            with self._lock:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
        except BrokenPipeError:
            self.closed = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())    # and nothing at exit tries the pipe again
            os.close(devnull)


say = _Output()
