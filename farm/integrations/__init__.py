"""Farm inside the frameworks people already run evaluations and agents in.

- ``farm.integrations.inspect``: an Inspect AI sandbox provider (``sandbox="farm"``), found by
  Inspect through the ``inspect_ai`` entry point (``pip install 'farm[inspect]'``);
- ``farm.integrations.smolagents``: ``FarmExecutor``, a smolagents remote Python executor
  (``pip install 'farm[smolagents]'``).

Each is a thin front over the farm client (``Session.exec``, ``Session.run``, ``session.files``)
and imports its framework: nothing in the rest of farm imports this package, so farm works
without either framework installed.
"""
