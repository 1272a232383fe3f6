"""The envd version we report; the SDK switches features on by comparing against it.

0.6.4 covers every client-side gate of e2b 2.63.0 we implement: default user (0.4.0),
close_stdin (0.5.2), octet-stream uploads (0.5.7), file metadata xattrs (0.6.2),
watch events with entry info (0.6.3) and watching network mounts (0.6.4).
"""

ENVD_VERSION = "0.6.4"
