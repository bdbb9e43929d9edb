"""``python -m datapipe.cli``: the same as the ``datapipe`` command."""

from datapipe.cli import main

if __name__ == "__main__":  # not when a spawned worker (mix-search --jobs) re-imports it
    main()
