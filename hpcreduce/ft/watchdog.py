"""The deadline watchdog (``runtime.watchdog``: every layer's waits arm it), by its ft name."""
from ..runtime.watchdog import DEADLINE, Watchdog, watchdog

__all__ = ["DEADLINE", "Watchdog", "watchdog"]
