"""envd: the in-sandbox daemon that speaks E2B's envd wire protocol (port 49983).

Stdlib-only on purpose: it runs inside guests that have nothing but Debian's python3.
See docs/envd.md for what it implements and how it is packaged.
"""
