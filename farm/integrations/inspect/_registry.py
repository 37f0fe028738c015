"""The ``inspect_ai`` entry point's target (pyproject.toml): importing it registers the
``farm`` sandbox provider with Inspect (the ``@sandboxenv`` decorator runs on import)."""

from farm.integrations.inspect.provider import FarmSandboxEnvironment

__all__ = ["FarmSandboxEnvironment"]
