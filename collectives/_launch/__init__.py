"""What ``python -m collectives.run`` is made of: the hosts of a job (``hosts.py``), the MPI
launcher that starts it and the remote shell that probes hosts (``launcher.py``), and the
restart loop with its summary (``supervise.py``), which knows neither MPI nor processes."""
