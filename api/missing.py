"""What a create of a template that does not exist is told."""

from __future__ import annotations

__all__ = ["CODE_INTERPRETER", "template_not_found"]


#: E2B's code-interpreter SDKs create this template by default; aenv's nodes serve it only
#: when told to (it is built and captured at their start)
CODE_INTERPRETER = "code-interpreter-v1"


def template_not_found(template_id: str) -> str:
    """What a 404 for `template_id` says: for the code interpreter's, how to serve it."""
    if template_id == CODE_INTERPRETER:
        return (
            f"template '{template_id}' is not served by this stack: start its nodes with "
            "AENV_CODE_INTERPRETER=1 (or `aenv up --code-interpreter`); the template is "
            "built and captured when a node starts"
        )
    return f"template '{template_id}' not found"
