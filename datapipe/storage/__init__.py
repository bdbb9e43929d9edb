"""Where bytes live: local disk or object storage (``uri``), atomic writes (``atomic``)."""
