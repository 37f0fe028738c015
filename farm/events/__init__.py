"""A run's events (``run_events``), where they live in Redis (``journal``), the
transcripts made of them (``transcripts``), a call's end (``exec_finish``) and a plain run's
lists (``lanes``). Imported by the client, the worker and ``farm serve``; nothing here imports
either side."""
