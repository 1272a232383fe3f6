"""Code two services use, owned by neither: the streaming sandbox proxy (the API's and
every node's) and the sparse-file helpers (the node's RAM copies and the snapshot worker's
chunking). It may import the domain and the bus, never a service (`api/`, `workers/`)."""
