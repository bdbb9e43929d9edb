"""``datapipe view``: a read-only web app over a run folder (or two, compared), served on this machine.

Layered above ``audit`` (the index of the run's files, explain's rules, the confined SQL connection)
and ``loader`` (shard rows as a trainer reads them); it imports nothing of the engine.

- ``runs``: one run folder (run.json, whether it is still going, the index of its document files);
- ``listing``: the Documents page's filters, its scan (a page at a time) and its histogram;
- ``aggregates``: the Overview's row-level numbers, behind one small interface;
- ``document``, ``originals``: one document and everything that explains it, its text as read;
- ``shard_rows``: packed rows through the loader, decoded; ``compare``: two runs' decisions;
- ``thresholds``, ``charts``: what the charts draw; ``pages``: the routes and templates;
- ``server``: the HTTP server (loopback, a token elsewhere, read-only, a strict CSP);
- ``launch``: what the command does (open the runs, serve, open a browser, stop on Ctrl-C).
"""
