"""A run's events (``run_events``), where they live in Redis (``journal``) and the
transcripts made of them (``transcripts``). Imported by the client, the worker and
``farm serve``; nothing here imports either side."""
