"""The node's disk: what its roots hold, by category (images-at-scale S7), and the one
budget that eviction keeps them under (S8: `budget.py`, `evict.py`, `node.py`)."""

from workers.node.disk.categories import CATEGORIES, IMAGES, STATE, Category, category_of
from workers.node.disk.usage import Tally, scan
from workers.node.disk.watch import SCAN_EVERY_S, DiskUsage, image_cache_dir

__all__ = [
    "CATEGORIES",
    "IMAGES",
    "SCAN_EVERY_S",
    "STATE",
    "Category",
    "DiskUsage",
    "Tally",
    "category_of",
    "image_cache_dir",
    "scan",
]
