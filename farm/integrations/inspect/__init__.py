"""Inspect AI sandbox provider ``farm``: ``Task(sandbox="farm")``, or
``Task(sandbox=("farm", FarmSandboxConfig(...)))``, with nothing to import (Inspect finds it
through the ``inspect_ai`` entry point, ``_registry``). Needs ``pip install 'farm[inspect]'``.

Modules: ``provider`` (the ``SandboxEnvironment``), ``config`` (``FarmSandboxConfig``),
``contract`` (farm's answers as Inspect's results and exceptions), ``farms`` (the farms and
boxes of this process).
"""

from farm.integrations.inspect.config import FarmSandboxConfig, FarmSandboxLimits
from farm.integrations.inspect.provider import FarmSandboxEnvironment

__all__ = ["FarmSandboxConfig", "FarmSandboxEnvironment", "FarmSandboxLimits"]
