"""The template aggregate: a named, bootable image sandboxes are created from.

Registered by whoever captured it (a node's snapshot or image import), deleted by a user;
for a persistent snapshot, where its capture is durable (`TemplateUploaded`): creates from
it may then go to any node when the one that took it is gone.

A built template is a table of tags (`domain/tags.py`): each successful build is captured
as a template of its own and published here (`PublishTemplateBuild`: it becomes `default`
and takes the tags it was built with); users move and remove tags; a capture no tag names
any more is *released* — kept in `released` until the API has dropped it from the nodes
(`DropTemplateCapture`), so a crash between the two leaves a record, not a leak.
"""

from domain.template.commands import *  # noqa: F403
from domain.template.commands import __all__ as _commands
from domain.template.decide import decide_template
from domain.template.events import *  # noqa: F403
from domain.template.events import __all__ as _events
from domain.template.evolve import evolve_template, fold_template
from domain.template.names import *  # noqa: F403
from domain.template.names import __all__ as _names
from domain.template.state import BUILTIN_TEMPLATES, Template

__all__ = [
    *_commands,
    *_events,
    *_names,
    "BUILTIN_TEMPLATES",
    "Template",
    "decide_template",
    "evolve_template",
    "fold_template",
]
