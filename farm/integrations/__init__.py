"""Farm inside the frameworks people already run evaluations and agents in.

``farm.integrations.inspect`` (an Inspect AI sandbox provider, ``sandbox="farm"``, found
through the ``inspect_ai`` entry point) and ``farm.integrations.smolagents`` (``FarmExecutor``).
Each is a thin front over the farm client; nothing else in farm imports this package, so farm
works without either framework installed.
"""
