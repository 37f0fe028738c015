"""Farms on this machine: the embedded ``LocalFarm`` (``embedded``), its ``redis-server``
(``redis_server``) and the process facts shared with the sandbox backends (``processes``).
Importing the package imports nothing: the sandbox layer uses ``processes`` alone."""
