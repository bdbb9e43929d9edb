"""Text facts shared by stages, dedup and training tools (character classes: ``charclass``)."""
