"""Error root of the network package: adapters translate pyroute2/iptables failures into it."""


class NetworkError(Exception):
    """A network slot could not be created, configured or removed."""
