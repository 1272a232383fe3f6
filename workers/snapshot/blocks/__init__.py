"""The node-local block service (issue 29): the repository's images served read-only over
NBD on a unix socket, each chunk fetched on first read into a cache shared by every export.

`protocol` is the wire (pure), `chunkcache` the chunk files, `export` an image's disk over
them, `server` the asyncio NBD server, `stats` its counters file. The process that runs it
is `aenv/roles/blocks.py`; the node reaches it only through the socket (never an import).
"""
