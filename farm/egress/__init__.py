"""Egress: what a box may reach, and the proxy outside the sandbox that holds it to that.

``policy`` parses allowlists and checks where a connection may go; ``proxy`` serves boxes'
endpoints (listening sockets made in each box's network namespace and handed over by its
kernel). Used by the worker; nothing here runs in a sandbox. Design: docs/design/egress.md.
"""
