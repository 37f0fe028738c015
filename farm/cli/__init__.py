"""The ``farm`` command, one module per command group: ``main`` (the app and the run,
session and status commands), ``serve_commands``, ``image_commands``, ``judge_commands`` and
``diagnose`` (``farm doctor``). Thin: parse, call the API, render."""
