"""Volumes on a node: the images (`images.py`), their content operations (`content.py` over
`debugfs.py`), the content endpoint the API relays to (`endpoint.py`) and the releaser
that makes what a sandbox left durable when it ends (`releaser.py`)."""
