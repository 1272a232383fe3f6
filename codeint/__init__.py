"""codeint: the code-interpreter server inside a `code-interpreter-v1` guest (port 49999).

It speaks E2B's code-interpreter protocol — what the unchanged `e2b-code-interpreter` SDKs
post to port 49999: `/execute` streaming NDJSON lines, `/contexts` — over Jupyter kernels
(Python, via Debian's python3-ipykernel and python3-jupyter-client) and a bash context of
its own. It runs on the guest's Debian python3, not on envd's runtime: it needs the image's
kernel stack. The host never imports it; the image builder copies its files into the guest
(docs/code-interpreter.md).
"""
