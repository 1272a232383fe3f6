"""The template builder: runs template builds in build sandboxes and snapshots them."""
