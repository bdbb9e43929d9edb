"""The run folder: its layout and markers (``layout``), its mirror of a remote folder (``remote``), its lock (``lock``)."""
