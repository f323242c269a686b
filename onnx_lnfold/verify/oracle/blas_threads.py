"""OpenBLAS's thread count, lowered for a stretch of the check.

The check's passes side by side (`verify.side_by_side`) run two steps at once, each on a thread of
its own; numpy's OpenBLAS would add its threads to each product, more threads than cores, which
then spin while they wait for each other. Where numpy's OpenBLAS cannot be found (another BLAS,
another system) nothing is changed: this is about time, never about what is computed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

# The thread-count functions of the OpenBLAS builds numpy ships: scipy-openblas (numpy 2 wheels,
# 64-bit integers) and a plain OpenBLAS, with or without the 64-bit suffix.
_NAMES = [(f"{p}_get_num_threads{s}", f"{p}_set_num_threads{s}") for p in ("scipy_openblas", "openblas") for s in ("64_", "")]


def _loaded_openblas() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """The (get, set) thread-count functions of the OpenBLAS loaded in this process, or None."""
    try:
        with open("/proc/self/maps") as maps:  # Linux: the files mapped, libraries among them
            paths = sorted({line.split(maxsplit=5)[5].strip() for line in maps if "openblas" in line.lower() and line.count(" ") >= 5})
    except OSError:
        return None
    for path in paths:
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in _NAMES:
            get, set_ = getattr(library, get_name, None), getattr(library, set_name, None)
            if get is not None and set_ is not None:
                return get, set_
    return None


@contextlib.contextmanager
def blas_threads_at_most(count: int) -> Iterator[None]:
    """OpenBLAS runs each product on at most `count` threads inside the `with` block; its thread
    count is given back after."""
    found = _loaded_openblas()
    if found is None or found[0]() <= count:
        yield
        return
    get, set_ = found
    before = get()
    set_(count)
    logger.debug("OpenBLAS threads %d -> %d", before, count)
    try:
        yield
    finally:
        set_(before)
