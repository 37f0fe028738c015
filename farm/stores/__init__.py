"""Where farm keeps blobs a session outlives: ``snapshot_store`` (the blob format, the
``SnapshotStore`` interface and its Redis store). Another store (S3, MinIO) goes beside it and
implements the same four calls. Imports nothing of the client or the worker."""
