"""The client tier: ``Farm`` (a connection to a farm), its ``Session``s, and their asyncio twins.

Modules, one noun each: ``farm`` (``Farm``: discovery, sessions, one-shot runs), ``session``
(``Session``: calls on one worker's sandbox), ``aio`` (the asyncio twins), ``broker`` (sending,
waiting, riding out outages), ``stream`` (a run's live events), ``callbacks`` (host functions
sandboxed code may call), ``files`` (``session.files``), ``restore`` (opt-in replay after a
state loss) and ``snapshots`` (snapshots, pause and resume, drains, following a moved
session). The client reaches workers only through the broker, never by import, with the
request models of ``farm.models.worker_requests``.
"""

from farm.client.aio import AsyncFarm, AsyncSession
from farm.client.farm import Farm, replay
from farm.client.session import Session

__all__ = ["AsyncFarm", "AsyncSession", "Farm", "Session", "replay"]
