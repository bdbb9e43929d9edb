"""Process hygiene in one room: numba loading and warm-up, per-process caches, memory release, task usage."""
