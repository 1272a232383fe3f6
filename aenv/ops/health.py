"""What `aenv status` reports as down: a pure reading of the supervisor's `stack.json`
(each role's state) and the API's readiness answer, so its wording is unit-tested."""

from __future__ import annotations

from collections.abc import Mapping


def stack_problems(info: Mapping[str, object], ready: Mapping[str, object]) -> list[str]:
    """One line per thing that is down; empty when the stack is fully up."""
    out: list[str] = []
    roles = info.get("role_status")
    if isinstance(roles, Mapping):
        for name, st in sorted(roles.items()):
            if isinstance(st, Mapping) and st.get("state") != "ready":
                restarts, code = st.get("restarts"), st.get("last_exit")
                out.append(
                    f"role {name} is {st.get('state')} ({restarts} restarts, last exit {code})"
                )
    if ready.get("status") != "ok":
        out.append(str(ready.get("message") or "the API is not ready"))
    warnings = ready.get("warnings")
    if isinstance(warnings, Mapping):  # serving, but something is at risk (uploads)
        out.extend(f"{name}: {text}" for name, text in sorted(warnings.items()))
    return out
