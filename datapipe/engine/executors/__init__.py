"""Where a run's tasks execute: ``base`` (the seam the runner talks to), ``in_process`` (no Ray) and
``ray/`` (embedded Ray on this machine, or a cluster): every use of Ray sits in that folder."""
