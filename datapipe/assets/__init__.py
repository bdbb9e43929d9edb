"""Files datapipe needs that are not code: the language-ID model, the ``filters/`` folder."""
