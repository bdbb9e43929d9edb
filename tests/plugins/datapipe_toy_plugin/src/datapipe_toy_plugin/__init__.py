"""A toy datapipe plugin: the ``shout`` stage and the ``lines`` input format, registered by entry points."""
