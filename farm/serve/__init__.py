"""``farm serve``: farm over HTTP (``/v1``, any language) and MCP (``/mcp``, ``farm mcp``).

A thin front over ``farm.client``, one engine: it never imports the worker or talks to Docker;
its calls reach workers through the broker like any client's. Modules: ``app`` (the ASGI app),
``sessions``, ``files`` and ``runs`` (the routes), ``schemas`` (bodies), ``problems`` (RFC 9457
errors), ``tokens`` and ``access`` (bearer tokens, scopes, owners, caps), ``mcp_server`` (the
MCP tools) and ``server`` (starting it: uvicorn, the first token, the state file). Why it is
built this way: docs/design/serve.md.
"""
